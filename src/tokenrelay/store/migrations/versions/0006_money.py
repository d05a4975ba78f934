"""Money: ledger rows carry their cost and the model that served them; keys get money budgets and budget periods.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage", sa.Column("cost", sa.BigInteger, nullable=False, server_default="0"))
    op.add_column("usage", sa.Column("priced", sa.Boolean, nullable=False, server_default=sa.false()))
    op.add_column("usage", sa.Column("served_model", sa.String(256), nullable=True))
    op.add_column("api_keys", sa.Column("budget_cost", sa.BigInteger, nullable=True))
    op.add_column("api_keys", sa.Column("budget_period", sa.String(16), nullable=False, server_default="total"))
    op.add_column("key_counters", sa.Column("cost_used", sa.BigInteger, nullable=False, server_default="0"))
    op.add_column("key_counters", sa.Column("cost_reserved", sa.BigInteger, nullable=False, server_default="0"))
    op.add_column("key_counters", sa.Column("period_start", sa.DateTime, nullable=True))
    op.add_column("reservations", sa.Column("cost", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    for table, columns in (
        ("reservations", ["cost"]),
        ("key_counters", ["period_start", "cost_reserved", "cost_used"]),
        ("api_keys", ["budget_period", "budget_cost"]),
        ("usage", ["served_model", "priced", "cost"]),
    ):
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.drop_column(column)
