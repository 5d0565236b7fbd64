"""`sluicegate serve`: the settings (flags, environment, file) become the configuration, the store is opened,
and the app is served until a signal ends it."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from sluicegate.backends.base import ModelRunner
from sluicegate.cli.options import PRECEDENCE, add_config_arg, add_settings_args, given
from sluicegate.config import UpstreamConfig
from sluicegate.settings import Loaded, SettingsError, load, to_config

log = logging.getLogger("sluicegate")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="serve a GGUF model over HTTP", description="Serve a GGUF model over HTTP.",
                       epilog=PRECEDENCE)
    add_config_arg(p)
    add_settings_args(p)


def load_args(args: argparse.Namespace) -> Loaded:
    """The settings of a command that takes the settings flags (`--config` included)."""
    return load(given(args), args.config)


def tokenizer_factory(cfg: UpstreamConfig, default_gguf: Path) -> Callable[[str], ModelRunner]:
    """An upstream model's own tokenizer: its --upstream-tokenizer GGUF, else --model's, vocab only."""
    paths = {m.name: m.tokenizer for m in cfg.models}

    def load_vocab(name: str) -> ModelRunner:
        from sluicegate.backends.llama_cpp import LlamaCppRunner

        return LlamaCppRunner(paths.get(name) or default_gguf, n_slots=1, vocab_only=True)

    return load_vocab


def run(args: argparse.Namespace) -> int:
    from sluicegate.telemetry.logs import setup_logging

    try:
        loaded = load_args(args)
        s = loaded.settings
        config = to_config(s)  # before any import of the model's runtime: a configuration that cannot work exits
    except (SettingsError, ValueError) as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2
    setup_logging(s.log_level, s.log_format)
    from sluicegate.telemetry import tracing

    try:
        provider = tracing.setup_from_environment()
    except ValueError as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return 2
    for warning in loaded.warnings:
        log.warning("%s", warning)
    if loaded.config_file is not None:
        log.info("settings: %s (beneath flags and SLUICEGATE_* variables)", loaded.config_file)
    log.info("data directory: %s", s.data_dir)

    from sluicegate.api.app import create_app
    from sluicegate.api.server.run import serve_app
    from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
    from sluicegate.cli.keys import serve_store

    path = config.model.path
    if path is None:
        path = default_model_path()
    for file in (path, *(p for _, p in config.model.more)):
        if not file.is_file():
            print(f"sluicegate: no model file at {file}", file=sys.stderr)
            return 2
    config = to_config(s, model_path=path)
    m = config.model
    templates = [("--chat-template-file", m.chat_template_file)] + [
        (f"--model-option {name}:chat_template_file", o.chat_template_file) for name, o in m.options]
    for flag, template in templates:
        if template is None:
            continue
        from sluicegate.serving.chat_template import read_chat_template

        try:
            read_chat_template(template)
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"sluicegate: {flag} {template}: {why}", file=sys.stderr)
            return 2

    def runner(gguf: Path, name: str | None, version: str | None, card: bool = False) -> LlamaCppRunner:
        """A local model's runner (its own options over the server's); `card`: its tokenizer alone, read at
        start for a model loaded when asked for."""
        o = m.options_for(name)
        return LlamaCppRunner(gguf, n_ctx=o.n_ctx or m.n_ctx, n_slots=o.n_slots or m.n_slots, n_batch=m.n_batch,
                              n_threads=o.n_threads or m.n_threads, name=name, version=o.version or version,
                              flash_attn=m.flash_attn, tiled_prefill=m.tiled_prefill,
                              adaptive_threads=m.adaptive_threads, vocab_only=card, hash_weights=True,
                              probe=not card)

    def factory() -> LlamaCppRunner:
        return runner(path, m.name, m.version)

    def named(name: str, gguf: Path, card: bool = False) -> Callable[[], ModelRunner]:
        return lambda: runner(gguf, name, None, card)

    more = {name: named(name, gguf) for name, gguf in m.more}
    cards = {"": lambda: runner(path, m.name, m.version, True), **{n: named(n, g, True) for n, g in m.more}}
    store, refusal = serve_store(config.store, host=s.host, insecure_no_auth=s.insecure_no_auth)
    if store is None:
        print(f"sluicegate: {refusal}", file=sys.stderr)
        return 2
    upstream = config.upstream
    try:
        app = create_app(config, factory, store=store, more=more, cards=cards,
                         tokenizers=tokenizer_factory(upstream, path) if upstream.targets else None)
        serve_app(app, app.state.sluicegate, log_level=s.log_level)
    finally:
        store.close()
        if provider is not None:
            provider.shutdown()  # the spans still batched go out
    return 0


__all__ = ["add_parser", "load_args", "run", "tokenizer_factory"]
