"""The `serve --upstream ...` flags (docs/upstream.md): the targets, their identity and tokenizers, the ladder."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from sluicegate.backends.base import ModelRunner
from sluicegate.config import UpstreamConfig, UpstreamModel, UpstreamTarget

KEY_ENV = "SLUICEGATE_UPSTREAM_KEY"  # the upstream API key when --upstream-key is not given


def add_upstream_args(p: argparse.ArgumentParser) -> None:
    d = UpstreamConfig()
    g = p.add_argument_group("upstream engines (docs/upstream.md, docs/timeouts.md)")
    g.add_argument("--upstream", action="append", default=[], metavar="[NAME=]URL",
                   help="an OpenAI-compatible engine's base URL, /v1 included; NAME routes requests naming that "
                        "model to it (default: the --name served, else the first model the URL lists); repeat: "
                        "several URLs for one NAME are balanced by outstanding requests")
    g.add_argument("--upstream-key", default=None,
                   help=f"API key sent to the upstreams as Bearer (default: the {KEY_ENV} environment variable)")
    g.add_argument("--no-local-model", action="store_true",
                   help="serve only the upstreams (--model then names the GGUF whose tokenizer they use)")
    g.add_argument("--upstream-tokenizer", action="append", default=[], metavar="NAME=GGUF",
                   help="the model's own tokenizer, read from a GGUF (vocab only; default: --model's)")
    g.add_argument("--upstream-version", action="append", default=[], metavar="NAME=VERSION",
                   help=f"the served version of an upstream model (default: {UpstreamModel('x').version})")
    g.add_argument("--upstream-digest", action="append", default=[], metavar="NAME=sha256:HEX",
                   help="the weights' digest of an upstream model (default: reported as unknown)")
    g.add_argument("--upstream-connect-timeout", type=float, default=d.connect_timeout_s, metavar="S")
    g.add_argument("--upstream-attempt-timeout", type=float, default=d.attempt_timeout_s, metavar="S",
                   help="one attempt's time to its first token")
    g.add_argument("--upstream-read-timeout", type=float, default=d.read_timeout_s, metavar="S",
                   help="longest silence between two chunks after the first token")
    g.add_argument("--upstream-retries", type=int, default=d.retries,
                   help="retries before the first token (connect errors, 502/503/504)")
    g.add_argument("--upstream-backoff", type=float, default=d.backoff_s, metavar="S",
                   help="wait before a retry, jittered over [S/2, S]")
    g.add_argument("--upstream-breaker-failures", type=int, default=d.breaker_failures,
                   help="consecutive failures that open an upstream's circuit")
    g.add_argument("--upstream-breaker-open", type=float, default=d.breaker_open_s, metavar="S",
                   help="how long an open circuit refuses with 503 before one trial request")


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"{flag} takes NAME=VALUE, not {v!r}")
        out[name] = rest
    return out


def upstream_from_args(args: argparse.Namespace, default_name: str | None, *,
                       max_timeout_s: float | None) -> UpstreamConfig:
    """The UpstreamConfig of the flags; ValueError (the operator's message) for one that cannot work.
    `max_timeout_s`: the server's cap on every budget (`--max-timeout`), which the whole ladder must fit."""
    targets = []
    for v in args.upstream:
        name, sep, url = v.partition("=")
        if not sep or "://" in name:
            name, url = default_name or "", v
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--upstream takes [NAME=]URL with an http(s) URL, not {v!r}")
        if not url.rstrip("/").endswith("/v1"):
            raise ValueError(f"--upstream {url}: give the OpenAI base URL, /v1 included (as the openai client's "
                             "base_url)")
        targets.append(UpstreamTarget(name, url.rstrip("/")))
    if args.no_local_model and not targets:
        raise ValueError("--no-local-model needs at least one --upstream")
    # a name an upstream serves is not also served locally: its GGUF gives the tokenizer, vocab only
    local = not args.no_local_model and not any(t.name == default_name for t in targets if default_name)
    versions, digests = _pairs(args.upstream_version, "--upstream-version"), _pairs(args.upstream_digest,
                                                                                    "--upstream-digest")
    toks = _pairs(args.upstream_tokenizer, "--upstream-tokenizer")
    names = {t.name for t in targets}
    for d in (versions, digests, toks):
        for n in d:
            if n not in names:
                raise ValueError(f"{n!r} is not the name of any --upstream")
    for n, dg in digests.items():
        if not (dg.startswith("sha256:") and len(dg) == 71 and all(c in "0123456789abcdef" for c in dg[7:])):
            raise ValueError(f"--upstream-digest {n}: give sha256: and 64 lowercase hex digits")
    models = tuple(UpstreamModel(n, versions.get(n, UpstreamModel(n).version), digests.get(n),
                                 Path(toks[n]) if n in toks else None) for n in sorted(names))
    cfg = UpstreamConfig(
        targets=tuple(targets), models=models, api_key=args.upstream_key or os.environ.get(KEY_ENV) or None,
        local_model=local, connect_timeout_s=args.upstream_connect_timeout,
        attempt_timeout_s=args.upstream_attempt_timeout, read_timeout_s=args.upstream_read_timeout,
        retries=args.upstream_retries, backoff_s=args.upstream_backoff,
        breaker_failures=args.upstream_breaker_failures, breaker_open_s=args.upstream_breaker_open,
    )
    cfg.check(max_timeout_s)
    return cfg


def tokenizer_factory(cfg: UpstreamConfig, default_gguf: Path) -> Callable[[str], ModelRunner]:
    """An upstream model's own tokenizer: its --upstream-tokenizer GGUF, else --model's, vocab only."""
    paths = {m.name: m.tokenizer for m in cfg.models}

    def load(name: str) -> ModelRunner:
        from sluicegate.backends.llama_cpp import LlamaCppRunner

        return LlamaCppRunner(paths.get(name) or default_gguf, n_slots=1, vocab_only=True)

    return load
