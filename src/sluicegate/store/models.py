"""The store's tables as typed SQLAlchemy 2 declarative models.

The schema itself is owned by the Alembic migrations under `migrations/versions/`; these models must match
the head revision (tests/store check it with Alembic's autogenerate comparison). A later feature adds its
table (jobs) with a new model here and a new revision there.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    BigInteger,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement

# Named constraints, so every backend names them the same and a later migration can drop or alter them.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    Postgres keeps `timestamptz`; SQLite has no time zones and hands back naive values, which are UTC here
    because only UTC is ever written.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: the store only takes timezone-aware UTC timestamps")
        return value.astimezone(dt.UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY; elsewhere the ledger's ids are 64-bit.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ApiKey(Base):
    """One API key. The secret itself is never stored: only its SHA-256 and a short prefix to find it by."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # `key_...`: public, the tenant
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16), index=True)  # first characters of the random part
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)  # hex SHA-256 of the whole key
    scopes: Mapped[str] = mapped_column(String(200))  # space-separated, sorted
    tpm: Mapped[int | None] = mapped_column(Integer)  # sustained tokens per minute; None: the server's default
    burst: Mapped[int | None] = mapped_column(Integer)  # bucket capacity in tokens; None: the server's default
    rpm: Mapped[int | None] = mapped_column(Integer)  # requests per minute, beside the tokens; None: the default
    max_concurrent: Mapped[int | None] = mapped_column(Integer)  # requests in flight at once; None: the default
    monthly_tokens: Mapped[int | None] = mapped_column(BigInteger)  # tokens per calendar month (UTC); None: no cap
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    @classmethod
    def unusable(cls, now: dt.datetime) -> ColumnElement[bool]:
        """SQL: the key was revoked, or has expired by `now` (its work stops: jobs, webhook deliveries)."""
        return cls.revoked_at.is_not(None) | (cls.expires_at.is_not(None) & (cls.expires_at <= now))


class UsageRecord(Base):
    """The usage ledger: one row per request on a metered route, written after the response ended."""

    __tablename__ = "usage"
    __table_args__ = (Index("ix_usage_key_id_day", "key_id", "day"), Index("ix_usage_day", "day"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    key_id: Mapped[str | None] = mapped_column(String(32), ForeignKey("api_keys.id"))  # None: auth was off
    day: Mapped[dt.date] = mapped_column(Date)  # UTC day the request ended
    route: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)  # the HTTP status sent (499: the client left)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    generated_tokens: Mapped[int] = mapped_column(Integer)
    request_id: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class IdempotencyRecord(Base):
    """One Idempotency-Key of one API key (tenancy/idempotency.py, docs/idempotency.md).

    The primary key is the unique constraint that decides between two requests (two replicas) claiming the
    same key at once: the one whose insert lands runs the work. `status` is None while the work runs (the
    claim, held by `owner` until `locked_until`, which the owner renews); then the answer is stored.
    """

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_expires_at", "expires_at"),)

    scope: Mapped[str] = mapped_column(String(32), primary_key=True)  # the API key's id; "" while auth is off
    key: Mapped[str] = mapped_column(String(255), primary_key=True)  # the client's Idempotency-Key
    route: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))  # hex SHA-256 of the route and the parsed request
    owner: Mapped[str] = mapped_column(String(32))  # the claim's random token: only its holder stores or releases
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    locked_until: Mapped[dt.datetime] = mapped_column(UTCDateTime())  # while running: another may take it after
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())  # created_at + the TTL; pruned after
    status: Mapped[int | None] = mapped_column(Integer)  # the stored answer's HTTP status; None: still running
    headers: Mapped[str | None] = mapped_column(Text)  # the stored answer's headers that matter, as JSON
    body: Mapped[bytes | None] = mapped_column(LargeBinary)  # the stored body (a stream: its SSE events)


class BatchFile(Base):
    """A file of the batch system (docs/jobs.md): an uploaded input, or a job's output or error file.

    The content lives in `batch_file_chunks`, written and read a chunk at a time (never whole in memory), so
    every replica sharing the store serves every file.
    """

    __tablename__ = "batch_files"
    __table_args__ = (Index("ix_batch_files_key_id_created_at", "key_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # `file-...`
    key_id: Mapped[str | None] = mapped_column(String(32))  # the owner; None: made while auth was off
    purpose: Mapped[str] = mapped_column(String(32))  # `batch` (uploads), `batch_output` (a job's files)
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())  # None: kept until deleted


class BatchFileChunk(Base):
    """One piece of a file's content, in order (`seq`)."""

    __tablename__ = "batch_file_chunks"

    file_id: Mapped[str] = mapped_column(String(40), ForeignKey("batch_files.id", ondelete="CASCADE"),
                                         primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class BatchJob(Base):
    """One batch job: the internal state machine (jobs/states.py) every shape maps to its own statuses."""

    __tablename__ = "batch_jobs"
    __table_args__ = (Index("ix_batch_jobs_key_id_created_at", "key_id", "created_at"),
                      Index("ix_batch_jobs_status", "status"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # `batch_...`
    key_id: Mapped[str | None] = mapped_column(String(32))
    shape: Mapped[str] = mapped_column(String(16))  # `openai` (/v1/batches) or `seed` (/v1/batch-predictions)
    endpoint: Mapped[str] = mapped_column(String(64))  # what every item runs through
    status: Mapped[str] = mapped_column(String(16))
    completion_window: Mapped[str] = mapped_column(String(16))
    input_file_id: Mapped[str | None] = mapped_column(String(40))
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    meta: Mapped[str | None] = mapped_column(Text)  # the caller's metadata, as JSON
    errors: Mapped[str | None] = mapped_column(Text)  # validation errors, as JSON (the job failed)
    total: Mapped[int] = mapped_column(Integer)
    est_tokens: Mapped[int] = mapped_column(BigInteger)  # what the job was estimated to cost (enqueued tokens)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())  # created_at + the completion window
    in_progress_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    finalizing_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    expired_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    cancelling_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    cancelled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class BatchItem(Base):
    """One request of a job: pending -> leased (an owner and an expiry) -> done | failed (or cancelled,
    expired). The result is written once: only by the lease's owner, while the lease is its own."""

    __tablename__ = "batch_items"
    __table_args__ = (Index("ix_batch_items_job_id_line", "job_id", "line"),
                      Index("ix_batch_items_state_line_id", "state", "line", "id"),
                      Index("ix_batch_items_owner", "owner"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)  # within a line, lease order
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("batch_jobs.id", ondelete="CASCADE"))
    line: Mapped[int] = mapped_column(Integer)  # 1-based line (or list index + 1) in the job's input
    custom_id: Mapped[str | None] = mapped_column(String(512))
    body: Mapped[str | None] = mapped_column(Text)  # the request body, as JSON (None: a bad line)
    state: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str | None] = mapped_column(String(32))  # the worker holding the lease
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # leases taken
    result_writes: Mapped[int] = mapped_column(Integer, default=0)  # results written: 1 once finished
    finished_by: Mapped[str | None] = mapped_column(String(32))  # the worker that wrote the result
    status_code: Mapped[int | None] = mapped_column(Integer)  # the HTTP status its request would have had
    result: Mapped[str | None] = mapped_column(Text)  # the response body (or error envelope), as JSON
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class PredictionRecord(Base):
    """One stored prediction (`/v1/predictions`): the record as answered, retrievable by the key that made it."""

    __tablename__ = "predictions"
    __table_args__ = (Index("ix_predictions_key_id_created_at", "key_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # `pred_...`
    key_id: Mapped[str] = mapped_column(String(32))  # the API key's id; "" while auth is off
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())  # list order (newest first), then id
    model: Mapped[str] = mapped_column(String(300))  # `name@version` that answered
    body: Mapped[str] = mapped_column(Text)  # the prediction record as JSON, exactly as first answered


class WebhookEndpoint(Base):
    """A URL one API key registered for event notifications (webhooks/, docs/webhooks.md).

    The signing secret is stored as issued: the server needs it to sign every delivery (Standard Webhooks
    signs with a shared secret), so it cannot be hashed the way API keys are. The API shows it once.
    """

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_key_id", "key_id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # `we_...`
    key_id: Mapped[str] = mapped_column(String(32))  # the API key's id; "" while auth is off
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[str] = mapped_column(String(500))  # space-separated, sorted
    secret: Mapped[str] = mapped_column(String(100))  # `whsec_` + base64 of 32 random bytes
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    disabled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())  # set when the receiver answered 410
    disabled_reason: Mapped[str | None] = mapped_column(String(200))
    deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())  # deleted: kept for the delivery log


class WebhookDelivery(Base):
    """One event for one endpoint: the body signed and sent until it is accepted, refused for good, or out of
    attempts. `event_id` is the `webhook-id` header, the same on every retry (receivers deduplicate by it)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_key_id_subject", "key_id", "subject"),
        Index("ix_webhook_deliveries_endpoint_id_created_at", "endpoint_id", "created_at"),
        UniqueConstraint("endpoint_id", "event_id"),  # an event emitted twice (a job system retrying) is sent once
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(64))  # `evt_...`: unique per endpoint
    endpoint_id: Mapped[str] = mapped_column(String(32), ForeignKey("webhook_endpoints.id"))
    key_id: Mapped[str] = mapped_column(String(32))
    event_type: Mapped[str] = mapped_column(String(64))  # `batch.completed`, ...
    subject: Mapped[str | None] = mapped_column(String(64))  # what the event is about (a job's id): the log's key
    body: Mapped[str] = mapped_column(Text)  # the exact JSON bytes signed and sent
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())  # due time; a sender's lease while sending
    last_status_code: Mapped[int | None] = mapped_column(Integer)  # the receiver's last HTTP status
    last_error: Mapped[str | None] = mapped_column(String(200))  # why the last attempt failed (no response body)
    log: Mapped[str] = mapped_column(Text)  # every attempt as JSON: [{at, status_code, error, duration_ms}]
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class ResponseRecord(Base):
    """One stored response (`/v1/responses`, `store: true`): the response as answered and every input item the
    model read for it (a continued conversation's history first), retrievable by the key that made it."""

    __tablename__ = "responses"
    __table_args__ = (Index("ix_responses_key_id_created_at", "key_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # `resp_...`
    key_id: Mapped[str] = mapped_column(String(32))  # the API key's id; "" while auth is off
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    model: Mapped[str] = mapped_column(String(300))  # `name@version` that answered
    body: Mapped[str] = mapped_column(Text)  # the response object as JSON, exactly as answered
    items: Mapped[str] = mapped_column(Text)  # the input items as a JSON array, in the order the model read them
