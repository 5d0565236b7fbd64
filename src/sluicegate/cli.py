"""`sluicegate serve | keys | db | jobs | probe | compat`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sluicegate import cli_jobs, cli_store, cli_upstream
from sluicegate.config import (
    AuthConfig,
    Config,
    ConnectionConfig,
    DeadlineConfig,
    IdempotencyConfig,
    LimitsConfig,
    ModelConfig,
    RateLimitConfig,
    StoreConfig,
    WebhookConfig,
)
from sluicegate.engine import SchedulerConfig


def _positive(text: str, unit: str, extra: str = "") -> float:
    """A positive, finite number of `unit` (the argparse types below share it); `extra` ends the refusal."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of {unit}: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of {unit}{extra}")
    return value


def positive_hours(text: str) -> float:
    """An argparse type: a positive, finite number of hours."""
    return _positive(text, "hours")


def host_list(text: str) -> list[str]:
    """An argparse type: comma-separated host names, IP addresses, `*.domain` patterns or `*`."""
    from sluicegate.api.middleware.trusted_host import parse_pattern

    try:
        hosts = [parse_pattern(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not hosts:
        raise argparse.ArgumentTypeError("no host given (`*` serves any)")
    return hosts
def seconds_or_none(text: str) -> float | None:
    """An argparse type: a positive, finite number of seconds, or `none`."""
    if text.strip().lower() == "none":
        return None
    return _positive(text, "seconds", ", or none")


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a GGUF model over HTTP")
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--name", default=None, help="served model name")
    p.add_argument("--model-version", default=None, help="served model version")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--allowed-hosts", type=host_list, action="extend", default=None, metavar="HOST[,HOST...]",
                   help="Host header names served, comma-separated or repeated (`*.example.com`: its subdomains; "
                        "`*`: any). Default: on a loopback --host only localhost, 127.0.0.1 and [::1] (DNS "
                        "rebinding protection); on 0.0.0.0 or another address, any")
    p.add_argument("--ctx", type=int, default=2048, help="context window per request, in tokens")
    p.add_argument("--slots", type=int, default=16, help="sequences decoded together")
    p.add_argument("--threads", type=int, default=None,
                   help="most CPU threads for compute (default: the usable cores: affinity and cgroup quota)")
    p.add_argument("--adaptive-threads", action=argparse.BooleanOptionalAction, default=True,
                   help="use fewer threads while other processes hold cores (default: on; docs/engine.md)")
    p.add_argument("--flash-attn", action=argparse.BooleanOptionalAction, default=True,
                   help="llama.cpp flash attention, every call kept on its one-row path: outputs never depend on "
                        "batching, and a conversation's earlier replies are reused from the cache (default: on; "
                        "--no-flash-attn: the plain attention kernels; docs/engine.md)")
    sc = SchedulerConfig()
    p.add_argument("--speculative-ngram", type=speculative, default="auto", metavar="auto|K",
                   help="speculative decoding for greedy requests, prompt-lookup drafts verified in one step "
                        "(vLLM's ngram method). auto (the default): only where verification is exact (flash "
                        f"attention), at most {sc.speculative_auto} drafts and only as many as the measured "
                        "cost of a row says pay; K: up to K drafts whenever a match is found (with "
                        "--no-flash-attn outputs may then differ from one-at-a-time decoding); 0: off "
                        "(docs/engine.md)")
    p.add_argument("--prompt-lookup-max", type=positive_int, default=sc.prompt_lookup_max, metavar="N",
                   help=f"speculative decoding: longest n-gram matched to find drafts (default {sc.prompt_lookup_max})")
    p.add_argument("--prompt-lookup-min", type=positive_int, default=sc.prompt_lookup_min, metavar="N",
                   help=f"speculative decoding: shortest n-gram matched (default {sc.prompt_lookup_min})")
    lim = LimitsConfig()
    p.add_argument("--max-body-bytes", type=int, default=lim.max_body_bytes, help="request body limit, in bytes")
    p.add_argument("--max-prompt-tokens", type=int, default=lim.max_prompt_tokens,
                   help="prompt tokens one request may send, every surface (default: the window minus one)")
    p.add_argument("--max-new-tokens", type=int, default=lim.max_new_tokens,
                   help="new tokens one request may ask for, every surface (the window bounds it too)")
    p.add_argument("--estimate-new-tokens", type=int, default=lim.estimate_new_tokens,
                   help="new tokens the cost estimate assumes for a request that sets no limit")
    p.add_argument("--drain-seconds", type=float, default=lim.drain_s,
                   help="on SIGTERM, how long in-flight requests may finish before they are cut (docs/connections.md)")
    dl = DeadlineConfig()
    p.add_argument("--default-timeout", type=seconds_or_none, default=dl.default_timeout_s, metavar="SECONDS",
                   help="time budget of a request that sends no timeout header (X-Request-Timeout, or the official "
                        "SDKs' own); default: none, so the maximum applies (docs/timeouts.md)")
    p.add_argument("--max-timeout", type=seconds_or_none, default=dl.max_timeout_s, metavar="SECONDS",
                   help=f"every request's time budget is capped here (default {dl.max_timeout_s:g}; none: no cap)")
    p.add_argument("--no-deadline-admission", action="store_true",
                   help="admit requests whatever the forecast says (they still end at their deadline); by default a "
                        "request that cannot meet its deadline at the measured speed is refused at once")
    add_connection_args(p)
    cli_store.add_store_args(p)
    cli_upstream.add_upstream_args(p)
    rl = RateLimitConfig()
    p.add_argument("--redis-url", default=rl.redis_url,
                   help="rate-limit buckets in Redis, shared by every replica (default: in this process)")
    p.add_argument("--rate-limit-fail-open", action="store_true",
                   help="while Redis is unreachable, admit requests unmetered instead of refusing them with 503")
    p.add_argument("--default-tpm", type=int, default=rl.default_tpm,
                   help="tokens per minute for API keys created without --tpm (default: such keys are unlimited)")
    p.add_argument("--default-burst", type=int, default=rl.default_burst,
                   help="bucket capacity for API keys created without --burst (default: one minute of tokens)")
    p.add_argument("--idempotency-ttl-hours", type=positive_hours, default=IdempotencyConfig().ttl_hours,
                   help="how long the answer to a request with an Idempotency-Key is kept and replayed")
    wh = WebhookConfig()
    cli_jobs.add_serve_args(p)
    p.add_argument("--webhook-allow-network", action="append", default=[], metavar="CIDR",
                   help="let webhook URLs reach this private, loopback or link-local address or network "
                        "(repeatable; default: public addresses only)")
    p.add_argument("--webhook-max-attempts", type=int, default=wh.max_attempts,
                   help="attempts per webhook delivery before it is marked failed")
    p.add_argument("--webhook-backoff-seconds", type=float, default=wh.backoff_base_s,
                   help="the first webhook retry's delay; each later one doubles (with jitter)")
    p.add_argument("--webhook-timeout-seconds", type=float, default=wh.timeout_s,
                   help="one webhook attempt's limit: connect, send and the receiver's answer")
    p.add_argument("--webhook-backoff-max-seconds", type=float, default=wh.backoff_max_s,
                   help="no webhook retry waits longer than this")
    p.add_argument("--webhook-poll-seconds", type=float, default=wh.poll_s,
                   help="how often each replica looks for due webhook deliveries it was not woken for; idle, it backs "
                        "off to 8x")
    p.add_argument("--webhook-max-in-flight", type=int, default=wh.max_in_flight,
                   help="webhook deliveries sent at once by this process")
    p.add_argument("--webhook-max-endpoints", type=int, default=wh.max_endpoints_per_key,
                   help="webhook endpoints one API key may register")
    p.add_argument("--insecure-no-auth", action="store_true",
                   help="serve on a non-loopback address while the store holds no API key (anyone who reaches "
                        "the port may use everything); auth still turns on once a key exists")
    p.add_argument("--log-level", default="info")


def positive_seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    return _positive(text, "seconds")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_connection_args(p: argparse.ArgumentParser) -> None:
    """The ConnectionConfig flags (shared with the reference server)."""
    c = ConnectionConfig()
    p.add_argument("--max-header-bytes", type=positive_int, default=c.max_header_bytes,
                   help="request line plus headers, in bytes; over it: 431")
    p.add_argument("--max-headers", type=positive_int, default=c.max_headers,
                   help="header fields per request; over it: 431")
    p.add_argument("--header-timeout", type=positive_seconds, default=c.header_timeout_s,
                   help="seconds from a request's first byte to the end of its headers; past it: 408 and close")
    p.add_argument("--body-timeout", type=positive_seconds, default=c.body_timeout_s,
                   help="seconds a request body may fall silent; past it: 408 and close")
    p.add_argument("--keepalive-timeout", type=positive_seconds, default=c.keepalive_s,
                   help="seconds a connection may sit with no request in progress (new or kept alive)")
    p.add_argument("--max-connections", type=positive_int, default=c.max_connections,
                   help="open connections served fully (default 4096, fewer if file descriptors are short)")
    p.add_argument("--health-connections", type=int, default=c.health_connections,
                   help="connections past --max-connections accepted for /healthz and /readyz only")


def connections_from_args(args: argparse.Namespace) -> ConnectionConfig:
    return ConnectionConfig(
        max_header_bytes=args.max_header_bytes, max_headers=args.max_headers, header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout, keepalive_s=args.keepalive_timeout, max_connections=args.max_connections,
        health_connections=args.health_connections)


def limits_from_args(args: argparse.Namespace) -> LimitsConfig:
    """Every LimitsConfig field from its `serve` flag."""
    return LimitsConfig(max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                        max_new_tokens=args.max_new_tokens, estimate_new_tokens=args.estimate_new_tokens,
                        drain_s=args.drain_seconds)


def webhooks_from_args(args: argparse.Namespace) -> WebhookConfig:
    """The webhook flags; a bad --webhook-allow-network is refused here, before anything starts."""
    from sluicegate.webhooks.ssrf import parse_networks

    try:
        parse_networks(args.webhook_allow_network)
    except ValueError as exc:
        raise SystemExit(f"sluicegate: --webhook-allow-network: {exc}") from None
    return WebhookConfig(
        allow_networks=tuple(args.webhook_allow_network), max_attempts=args.webhook_max_attempts,
        backoff_base_s=args.webhook_backoff_seconds, backoff_max_s=args.webhook_backoff_max_seconds,
        timeout_s=args.webhook_timeout_seconds, poll_s=args.webhook_poll_seconds,
        max_in_flight=args.webhook_max_in_flight, max_endpoints_per_key=args.webhook_max_endpoints,
    )
def nonnegative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be at least 0")
    return value


def speculative(text: str) -> str | int:
    """`--speculative-ngram`: "auto" or a whole number >= 0."""
    return "auto" if text == "auto" else nonnegative_int(text)


def engine_from_args(args: argparse.Namespace, deadline_admission: bool) -> SchedulerConfig:
    """The engine's knobs; a speculative n-gram range with min > max is refused like any bad flag."""
    if args.prompt_lookup_min > args.prompt_lookup_max:
        raise SystemExit(f"sluicegate: --prompt-lookup-min ({args.prompt_lookup_min}) is over --prompt-lookup-max "
                         f"({args.prompt_lookup_max})")
    fixed = 0 if args.speculative_ngram == "auto" else int(args.speculative_ngram)
    auto = SchedulerConfig().speculative_auto if args.speculative_ngram == "auto" else 0
    return SchedulerConfig(deadline_admission=deadline_admission, speculative_ngram=fixed, speculative_auto=auto,
                           prompt_lookup_max=args.prompt_lookup_max, prompt_lookup_min=args.prompt_lookup_min)


def deadlines_from_args(args: argparse.Namespace) -> tuple[DeadlineConfig, bool]:
    """The time budgets, and whether deadline admission is on (docs/timeouts.md)."""
    return (DeadlineConfig(default_timeout_s=args.default_timeout, max_timeout_s=args.max_timeout),
            not args.no_deadline_admission)


def serve(args: argparse.Namespace) -> int:
    name, version = args.name, args.model_version
    if args.model is None:
        name, version = name or "smollm2-135m-instruct", version or "q4_1"
    try:  # before any import of the model's runtime: a configuration that cannot work exits at once
        upstream = cli_upstream.upstream_from_args(args, name, max_timeout_s=args.max_timeout)
    except ValueError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2

    from sluicegate.api.app import create_app
    from sluicegate.api.server.run import serve_app
    from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path

    path = args.model
    if path is None:
        path = default_model_path()
    elif not path.is_file():
        print(f"sluicegate: no model file at {path}", file=sys.stderr)
        return 2
    deadlines, deadline_admission = deadlines_from_args(args)
    config = Config(
        upstream=upstream,
        model=ModelConfig(path=path, name=name, version=version, n_ctx=args.ctx, n_slots=args.slots,
                          n_threads=args.threads, adaptive_threads=args.adaptive_threads,
                          flash_attn=args.flash_attn),
        limits=limits_from_args(args),
        engine=engine_from_args(args, deadline_admission),
        deadlines=deadlines,
        connections=connections_from_args(args),
        store=StoreConfig(data_dir=args.data_dir, database_url=args.database_url),
        auth=AuthConfig(insecure_no_auth=args.insecure_no_auth),
        ratelimit=RateLimitConfig(redis_url=args.redis_url, fail_open=args.rate_limit_fail_open,
                                  default_tpm=args.default_tpm, default_burst=args.default_burst),
        idempotency=IdempotencyConfig(ttl_hours=args.idempotency_ttl_hours),
        webhooks=webhooks_from_args(args),
        jobs=cli_jobs.config_from_args(args),
        host=args.host, port=args.port,
        allowed_hosts=None if args.allowed_hosts is None else tuple(args.allowed_hosts),
    )
    m = config.model

    def factory() -> LlamaCppRunner:
        return LlamaCppRunner(path, n_ctx=m.n_ctx, n_slots=m.n_slots, n_batch=m.n_batch, n_threads=m.n_threads,
                              name=m.name, version=m.version, flash_attn=m.flash_attn,
                              adaptive_threads=m.adaptive_threads)

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store, refusal = cli_store.serve_store(args)
    if store is None:
        print(f"sluicegate: {refusal}", file=sys.stderr)
        return 2
    try:
        app = create_app(config, factory, store=store,
                         tokenizers=cli_upstream.tokenizer_factory(upstream, path) if upstream.targets else None)
        serve_app(app, app.state.sluicegate, log_level=args.log_level)
    finally:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Tools with their own argument parsers get everything after their name untouched.
    if argv and argv[0] == "probe":
        from sluicegate.contract import probe_cli

        return probe_cli.main(argv[1:])
    if argv and argv[0] == "compat":
        from sluicegate.contract import compat as compat_cli

        return compat_cli.main(argv[1:])
    parser = argparse.ArgumentParser(prog="sluicegate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    cli_store.add_parsers(sub)
    cli_jobs.add_parsers(sub)
    sub.add_parser("probe", help="grade a server's boundary with awkward requests (probe --help)")
    sub.add_parser("compat", help="classify schema changes as compatible or breaking (compat --help)")
    args = parser.parse_args(argv)
    if args.command in ("keys", "db"):
        return cli_store.run(args)
    if args.command == "jobs":
        return cli_jobs.run(args)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
