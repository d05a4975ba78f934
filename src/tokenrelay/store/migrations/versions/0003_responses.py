"""Stored Responses API objects (`store: true`) with their input items and conversation.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=True),
        sa.Column("response", sa.JSON, nullable=False),
        sa.Column("input_items", sa.JSON, nullable=False),
        sa.Column("context", sa.JSON, nullable=False),
    )
    op.create_index("ix_responses_expires_at", "responses", ["expires_at"])


def downgrade() -> None:
    op.drop_table("responses")
