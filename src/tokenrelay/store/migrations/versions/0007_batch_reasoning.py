"""Batch lines keep their answer's reasoning tokens, for the batch's `usage.output_tokens_details`.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_lines", sa.Column("reasoning_tokens", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("batch_lines") as batch:
        batch.drop_column("reasoning_tokens")
