"""Batch jobs: files and their chunks, jobs, items (leases, results written once).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "batch_files",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_batch_files"),
    )
    op.create_index("ix_batch_files_key_id_created_at", "batch_files", ["key_id", "created_at"])
    op.create_table(
        "batch_file_chunks",
        sa.Column("file_id", sa.String(40), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["file_id"], ["batch_files.id"], name="fk_batch_file_chunks_file_id_batch_files",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("file_id", "seq", name="pk_batch_file_chunks"),
    )
    op.create_table(
        "batch_jobs",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("shape", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("input_file_id", sa.String(40), nullable=True),
        sa.Column("output_file_id", sa.String(40), nullable=True),
        sa.Column("error_file_id", sa.String(40), nullable=True),
        sa.Column("meta", sa.Text(), nullable=True),
        sa.Column("errors", sa.Text(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("est_tokens", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        *(sa.Column(f"{s}_at", TS, nullable=True) for s in
          ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")),
        sa.PrimaryKeyConstraint("id", name="pk_batch_jobs"),
    )
    op.create_index("ix_batch_jobs_key_id_created_at", "batch_jobs", ["key_id", "created_at"])
    op.create_index("ix_batch_jobs_status", "batch_jobs", ["status"])
    op.create_table(
        "batch_items",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(40), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(512), nullable=True),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(32), nullable=True),
        sa.Column("lease_until", TS, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result_writes", sa.Integer(), nullable=False),
        sa.Column("finished_by", sa.String(32), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["batch_jobs.id"], name="fk_batch_items_job_id_batch_jobs",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_batch_items"),
    )
    op.create_index("ix_batch_items_job_id_line", "batch_items", ["job_id", "line"])
    op.create_index("ix_batch_items_state_line_id", "batch_items", ["state", "line", "id"])
    op.create_index("ix_batch_items_owner", "batch_items", ["owner"])


def downgrade() -> None:
    op.drop_table("batch_items")
    op.drop_table("batch_jobs")
    op.drop_table("batch_file_chunks")
    op.drop_table("batch_files")
