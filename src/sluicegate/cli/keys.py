"""`sluicegate keys create | list | revoke` and `sluicegate db upgrade`: the store from the command line.

Each reads the store's settings as `serve` does (`--database-url`, `--data-dir`, `--config FILE`, the
`SLUICEGATE_*` variables), says on stderr which store it uses, and refuses to list or revoke in a SQLite store
that does not exist (a command run from another directory would otherwise create an empty one silently). On
SQLite they migrate the file themselves; on any other database they refuse a schema that is not at the code's
head and name the command that upgrades it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sluicegate.cli import types as ct
from sluicegate.cli.options import add_config_arg, add_settings_args, given
from sluicegate.config import StoreConfig
from sluicegate.settings import SettingsError, load
from sluicegate.textsafe import escape

if TYPE_CHECKING:
    from sluicegate.store.db import Store

log = logging.getLogger("sluicegate")
SCOPES = ["generate", "batch", "admin", "metrics"]


def add_store_args(p: argparse.ArgumentParser) -> None:
    add_config_arg(p)
    add_settings_args(p, only=("database_url", "data_dir"))


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    create = ksub.add_parser("create", help="create a key; its secret is the last line of the output")
    create.add_argument("--name", required=True, help="what the key is for (shown by keys list)")
    create.add_argument("--scope", action="append", dest="scopes", metavar="SCOPE", choices=SCOPES,
                        help="generate, batch, admin or metrics; repeat for several (default: generate)")
    create.add_argument("--tpm", type=ct.positive_int, default=None, help="sustained tokens per minute")
    create.add_argument("--burst", type=ct.positive_int, default=None, help="token bucket capacity")
    create.add_argument("--rpm", type=ct.positive_int, default=None,
                        help="requests per minute, beside the tokens (default: the server's --default-rpm)")
    create.add_argument("--max-concurrent", type=ct.positive_int, default=None, metavar="N",
                        help="requests in flight at once (default: the server's --default-max-concurrent)")
    create.add_argument("--monthly-tokens", type=ct.positive_int, default=None, metavar="N",
                        help="tokens per calendar month, UTC (default: no budget)")
    create.add_argument("--expires-in", type=ct.positive_days, default=None, metavar="DAYS",
                        help="the key stops working after this many days (default: never)")
    create.add_argument("--secret-stdin", action="store_true",
                        help="import an existing secret, read from the first line of standard input, instead of "
                             "making one (a sluicegate key, or any other random secret of 24 to 256 visible "
                             "characters, e.g. one clients already hold for another server)")
    add_store_args(create)
    listing = ksub.add_parser("list", help="every key, one a line, its ID first (never the secret)")
    add_store_args(listing)
    revoke = ksub.add_parser("revoke", help="revoke a key: refused everywhere within a second")
    revoke.add_argument("key_id", metavar="ID")
    add_store_args(revoke)

    db = sub.add_parser("db", help="the store's schema")
    dsub = db.add_subparsers(dest="db_command", required=True)
    up = dsub.add_parser("upgrade", help="apply the migrations this version ships (idempotent)")
    add_store_args(up)


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine: `localhost`, 127.0.0.0/8 or ::1 (not 0.0.0.0, not a name)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve_store(cfg: StoreConfig, *, host: str, insecure_no_auth: bool) -> tuple[Store | None, str | None]:
    """The store `serve` will use, migrated on SQLite; or why it cannot start (with the command that fixes it).

    Without a key in the store auth is off, so the server then binds only to loopback unless told
    `--insecure-no-auth` (logged)."""
    from sqlalchemy.exc import SQLAlchemyError

    from sluicegate.store.db import Store, display_url, resolve_url
    from sluicegate.store.migrate import ensure_current, schema_state
    from sluicegate.tenancy.keys import any_keys

    url = resolve_url(cfg.database_url, cfg.data_dir)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-connection chatter; upgrades are logged here
    store = Store.open(url)
    try:
        before = schema_state(store.engine)
        state = ensure_current(store.engine, auto_upgrade=store.is_sqlite)
        if state.current != before.current:
            log.info("store %s migrated from %s to revision %s", display_url(url), before.current or "an empty schema",
                     state.current)
        refusal = state.refusal(url)
        if refusal is not None:
            store.close()
            return None, refusal
        keyed = any_keys(store)
    except SQLAlchemyError as exc:
        store.close()
        return None, f"the database at {display_url(url)} cannot be used: {type(exc).__name__}"
    shown = display_url(url)
    if keyed:
        log.info("store %s: API keys are required", shown)
        if insecure_no_auth:
            log.warning("--insecure-no-auth has no effect: the store holds API keys, so every request needs one")
    elif is_loopback(host):
        log.info("store %s holds no API key: auth is off (loopback only) until one is created with "
                 "`sluicegate keys create`", shown)
    elif insecure_no_auth:
        log.warning("--insecure-no-auth: serving on %s WITHOUT authentication; anyone who reaches the port may "
                    "use everything (auth turns on once the store holds a key)", host)
    else:
        store.close()
        return None, (f"the store {shown} holds no API key, so serving on {host} would let anyone use "
                      "everything. Create a key first (sluicegate keys create --name NAME), serve on 127.0.0.1, "
                      "or pass --insecure-no-auth")
    return store, None


def _fail(message: str) -> int:
    print(f"sluicegate: {message}", file=sys.stderr)
    return 2


def _when(value: dt.datetime | None, none: str = "never") -> str:
    return none if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _sqlite_file(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return Path(u.database) if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:") else None


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from sluicegate.store.db import Store, display_url, resolve_url

    try:
        s = load(given(args), args.config).settings
    except SettingsError as exc:
        return _fail(str(exc))
    secret = None
    if args.command == "keys" and args.keys_command == "create" and args.secret_stdin:
        secret = sys.stdin.readline().strip()
        if not secret:
            return _fail("--secret-stdin: standard input holds no secret")
    url = resolve_url(s.database_url, s.data_dir)
    file = _sqlite_file(url)
    creating = args.command == "db" or args.keys_command == "create"
    if file is not None and not file.exists() and not creating:
        return _fail(f"no store at {file}: no key was ever created there. `serve` and `keys` must name the same "
                     "store (--data-dir, --database-url, or the same --config file)")
    print(f"store: {display_url(url)}" + (" (new)" if file is not None and not file.exists() else ""),
          file=sys.stderr)
    try:
        if args.command == "db":
            return _db_upgrade(url)
        store = Store.open(url)
        try:
            refusal = _ready(store, url)
            if refusal is not None:
                return _fail(refusal)
            return _keys(store, args, secret)
        finally:
            store.close()
    except SQLAlchemyError as exc:
        return _fail(f"the database at {display_url(url)} cannot be used: {type(exc).__name__}")


def _ready(store: Store, url: str) -> str | None:
    from sluicegate.store.migrate import ensure_current

    return ensure_current(store.engine, auto_upgrade=store.is_sqlite).refusal(url)


def _db_upgrade(url: str) -> int:
    from sluicegate.store.db import display_url, make_engine
    from sluicegate.store.migrate import schema_state, upgrade

    engine = make_engine(url)
    try:
        before = schema_state(engine)
    finally:
        engine.dispose()
    after = upgrade(url)
    if before.current == after.current:
        print(f"{display_url(url)}: already at revision {after.current} (head)")
    else:
        print(f"{display_url(url)}: upgraded from {before.current or 'an empty schema'} to revision {after.current}")
    return 0


def _keys(store: Store, args: argparse.Namespace, secret: str | None) -> int:
    from sluicegate.tenancy import keys

    if args.keys_command == "create":
        try:
            expires = None if args.expires_in is None else dt.timedelta(days=args.expires_in)
        except OverflowError:
            return _fail("--expires-in: a key's lifetime ends at 9999-12-31 at the latest")
        try:
            scopes = keys.parse_scopes(args.scopes or ["generate"])
            record, made = keys.create_key(store, args.name, scopes, tpm=args.tpm, burst=args.burst,
                                           expires_in=expires, secret=secret, rpm=args.rpm,
                                           max_concurrent=args.max_concurrent, monthly_tokens=args.monthly_tokens)
        except ValueError as exc:
            return _fail(str(exc))
        print(f"created {record.id} ({escape(record.name)}): scopes {','.join(sorted(record.scopes))}, "
              f"tpm {record.tpm or 'default'}, burst {record.burst or 'default'}, rpm {record.rpm or 'default'}, "
              f"concurrent {record.max_concurrent or 'default'}, monthly tokens {record.monthly_tokens or 'no cap'}, "
              f"expires {_when(record.expires_at)}")
        if secret is not None:
            print("the secret was read from standard input and is stored only as a hash")
            return 0
        print("the secret follows; it is shown this once and stored only as a hash:")
        print(made)
        return 0
    if args.keys_command == "list":
        for r in keys.list_keys(store):
            print("  ".join([
                r.id, r.display_prefix + "...", r.state(), ",".join(sorted(r.scopes)),
                f"tpm={r.tpm or '-'}", f"burst={r.burst or '-'}", f"rpm={r.rpm or '-'}",
                f"concurrent={r.max_concurrent or '-'}", f"monthly={r.monthly_tokens or '-'}",
                f"created={_when(r.created_at)}",
                f"expires={_when(r.expires_at)}", f"revoked={_when(r.revoked_at, '-')}",
                escape(r.name),  # a name stored before names refused control characters cannot forge a row
            ]))
        return 0
    before = keys.get_key(store, args.key_id)
    if before is None:
        print(f"sluicegate: no key {args.key_id}", file=sys.stderr)
        return 1
    after = keys.revoke_key(store, args.key_id)
    assert after is not None and after.revoked_at is not None
    if before.revoked_at is not None:
        print(f"{after.id} was already revoked at {_when(after.revoked_at)}")
    else:
        print(f"revoked {after.id} at {_when(after.revoked_at)}; every server refuses it within a second")
    return 0


__all__ = ["add_parsers", "add_store_args", "is_loopback", "run", "serve_store"]
