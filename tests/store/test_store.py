"""The store on SQLite and Postgres: migrations, the head check, and the key table (create, find, revoke)."""

from __future__ import annotations

import datetime as dt

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from sluicegate.store.db import Store, display_url
from sluicegate.store.migrate import SchemaState, SchemaStatus, ensure_current, head_revision, schema_state, upgrade
from sluicegate.store.models import ApiKey, Base
from sluicegate.tenancy.keys import (
    DEFAULT_SCOPES,
    Scope,
    any_keys,
    create_key,
    find_key,
    get_key,
    list_keys,
    new_secret,
    revoke_key,
)


def test_models_match_the_migrations(db_url: str) -> None:
    """The typed models and the head revision describe the same schema (Alembic's autogenerate sees nothing)."""
    store = Store.open(db_url)
    try:
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
    finally:
        store.close()


def test_schema_states_and_the_refusal(empty_db_url: str) -> None:
    store = Store.open(empty_db_url)
    try:
        state = schema_state(store.engine)
        assert state.status is SchemaStatus.EMPTY and state.head == head_revision() == "0008"
        message = state.refusal(empty_db_url)
        assert message is not None and f"sluicegate db upgrade --database-url {display_url(empty_db_url)}" in message
        upgrade(empty_db_url, "0001")
        state = schema_state(store.engine)
        assert state.status is SchemaStatus.BEHIND and state.current == "0001"
        assert "is at revision 0001" in (state.refusal(empty_db_url) or "")
        assert upgrade(empty_db_url).status is SchemaStatus.CURRENT
        assert schema_state(store.engine).refusal(empty_db_url) is None
        assert upgrade(empty_db_url).current == "0008"  # idempotent
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        state = schema_state(store.engine)
        assert state.status is SchemaStatus.UNKNOWN and "newer version" in (state.refusal(empty_db_url) or "")
    finally:
        store.close()


def test_auto_upgrade_only_when_allowed(empty_db_url: str) -> None:
    store = Store.open(empty_db_url)
    try:
        assert ensure_current(store.engine, auto_upgrade=False).status is SchemaStatus.EMPTY
        assert ensure_current(store.engine, auto_upgrade=True).status is SchemaStatus.CURRENT
    finally:
        store.close()


def test_the_refusal_never_shows_a_password() -> None:
    url = "postgresql+psycopg://app:s3cret-pw@db.example:5432/sg"
    state = SchemaState(SchemaStatus.EMPTY, None, "0003")
    message = state.refusal(url)
    assert message is not None and "s3cret-pw" not in message
    assert "sluicegate db upgrade --database-url postgresql+psycopg://app:***@db.example:5432/sg" in message


def test_keys_round_trip(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        assert not any_keys(store)
        record, secret = create_key(store, "ci", {Scope.GENERATE, Scope.METRICS}, tpm=1000, burst=200)
        assert any_keys(store)
        assert record.id.startswith("key_") and record.scopes == {Scope.GENERATE, Scope.METRICS}
        assert record.created_at.tzinfo is not None and record.usable()
        found = find_key(store, secret)
        assert found == record
        assert find_key(store, new_secret()) is None  # well-formed, unknown
        assert find_key(store, secret[:-1] + ("0" if secret[-1] != "0" else "1")) is None  # checksum fails
        with store.session() as s:
            row = s.get(ApiKey, record.id)
            assert row is not None
            stored = " ".join(str(v) for v in (row.id, row.name, row.prefix, row.secret_hash, row.scopes))
        assert secret not in stored and secret[8:] not in stored  # only the hash and a short prefix are kept
        assert [k.id for k in list_keys(store)] == [record.id]
        revoked = revoke_key(store, record.id)
        assert revoked is not None and revoked.revoked_at is not None and revoked.state() == "revoked"
        again = revoke_key(store, record.id)
        assert again is not None and again.revoked_at == revoked.revoked_at  # the first time is kept
        assert revoke_key(store, "key_missing") is None
        assert find_key(store, secret) == revoked  # still found, and refused by its state
        assert any_keys(store)  # a revoked key keeps auth on
    finally:
        store.close()


def test_expiry_and_defaults(db_url: str) -> None:
    store = Store.open(db_url)
    try:
        record, _ = create_key(store, "short", expires_in=dt.timedelta(days=1))
        assert record.scopes == DEFAULT_SCOPES and record.tpm is None and record.burst is None
        assert record.expires_at is not None
        assert record.state() == "active"
        assert record.state(record.expires_at + dt.timedelta(seconds=1)) == "expired"
        stored = get_key(store, record.id)
        assert stored is not None and stored.expires_at == record.expires_at  # tz-aware UTC both ways
        with pytest.raises(ValueError):
            create_key(store, "", set())
        with pytest.raises(ValueError):
            create_key(store, "x", {Scope.GENERATE}, tpm=0)
        with pytest.raises(ValueError):
            create_key(store, "x", set())
    finally:
        store.close()


def test_threads_take_turns_on_the_in_memory_store() -> None:
    """One shared SQLite connection: sessions in many threads, each writing in its own transaction, never see
    each other's BEGIN/COMMIT/ROLLBACK (every write lands; none fails)."""
    import threading

    from sluicegate.store.db import in_memory

    store = in_memory()
    errors: list[BaseException] = []
    try:
        with store.session() as s, s.begin():
            s.execute(text("CREATE TABLE turns (thread INTEGER, n INTEGER)"))

        def work(t: int) -> None:
            try:
                for n in range(40):
                    if n % 3 == 0:  # a transaction that rolls back, beside the others' commits
                        with store.session() as s:
                            s.execute(text("INSERT INTO turns VALUES (:t, :n)"), {"t": t, "n": n})
                            s.rollback()
                        continue
                    with store.session() as s, s.begin():
                        s.execute(text("INSERT INTO turns VALUES (:t, :n)"), {"t": t, "n": n})
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        with store.session() as s:
            rows = s.execute(text("SELECT thread, count(*) FROM turns GROUP BY thread")).all()
        assert sorted(rows) == [(t, 26) for t in range(6)]  # 40 writes, 14 rolled back, per thread
    finally:
        store.close()
