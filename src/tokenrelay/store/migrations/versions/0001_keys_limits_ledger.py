"""API keys, their shared counters, budget reservations and the usage ledger.

Revision ID: 0001
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("models", sa.JSON, nullable=True),
        sa.Column("admin", sa.Boolean, nullable=False),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("budget_tokens", sa.BigInteger, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=True),
        sa.Column("revoked_at", sa.DateTime, nullable=True),
        sa.Column("rotated_at", sa.DateTime, nullable=True),
        sa.Column("last_used_at", sa.DateTime, nullable=True),
    )
    op.create_table(
        "key_counters",
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id"), primary_key=True),
        sa.Column("rpm_level", sa.Float, nullable=False),
        sa.Column("rpm_at", sa.Float, nullable=False),
        sa.Column("tpm_level", sa.Float, nullable=False),
        sa.Column("tpm_at", sa.Float, nullable=False),
        sa.Column("budget_used", sa.BigInteger, nullable=False),
        sa.Column("budget_reserved", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("key_id", sa.String(32), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("tokens", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_reservations_created_at", "reservations", ["created_at"])
    op.create_table(
        "usage",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("key_name", sa.String(128), nullable=True),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("streamed", sa.Boolean, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("error", sa.String(128), nullable=True),
        sa.Column("cancelled", sa.Boolean, nullable=False),
        sa.Column("finish_reasons", sa.String(512), nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("usage_estimated", sa.Boolean, nullable=False),
        sa.Column("ttft_ms", sa.Float, nullable=True),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("user", sa.String(256), nullable=True),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("ended_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_usage_request_id", "usage", ["request_id"])
    op.create_index("ix_usage_started_at", "usage", ["started_at"])
    op.create_index("ix_usage_key_started", "usage", ["key_id", "started_at"])
    op.create_index("ix_usage_model_started", "usage", ["model", "started_at"])


def downgrade() -> None:
    op.drop_table("usage")
    op.drop_table("reservations")
    op.drop_table("key_counters")
    op.drop_table("api_keys")
