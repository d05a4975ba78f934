"""The Batch API: uploaded and written files, batches, their lines; the ledger's rows name their batch.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage", sa.Column("batch_id", sa.String(64), nullable=True))
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=True),
        sa.Column("content", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_files_key_created", "files", ["key_id", "created_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("errors", sa.JSON, nullable=True),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("completed", sa.Integer, nullable=False),
        sa.Column("failed", sa.Integer, nullable=False),
        sa.Column("usage", sa.JSON, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
        *(sa.Column(f"{state}_at", sa.DateTime, nullable=True) for state in _STATES),
    )
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_key_created", "batches", ["key_id", "created_at"])
    op.create_table(
        "batch_lines",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("line", sa.Integer, nullable=False),
        sa.Column("custom_id", sa.String(512), nullable=False),
        sa.Column("body", sa.JSON, nullable=False),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("claim", sa.String(32), nullable=True),
        sa.Column("claimed_at", sa.DateTime, nullable=True),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", "line"),
    )
    op.create_index("ix_batch_lines_state", "batch_lines", ["batch_id", "state"])


_STATES = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")


def downgrade() -> None:
    op.drop_table("batch_lines")
    op.drop_table("batches")
    op.drop_table("files")
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("batch_id")
