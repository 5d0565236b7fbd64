"""Responses: one row per stored response (`/v1/responses`), its input items beside it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(300), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("items", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_responses"),
    )
    op.create_index("ix_responses_key_id_created_at", "responses", ["key_id", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_responses_key_id_created_at", table_name="responses")
    op.drop_table("responses")
