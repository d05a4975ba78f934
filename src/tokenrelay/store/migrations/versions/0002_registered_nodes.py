"""Upstream nodes registered at run time, shared by every replica and worker.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registered_nodes",
        sa.Column("model_id", sa.String(256), primary_key=True),
        sa.Column("name", sa.String(256), primary_key=True),
        sa.Column("settings", sa.JSON, nullable=False),
        sa.Column("api_key_sealed", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("registered_nodes")
