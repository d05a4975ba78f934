"""Table definitions (SQLAlchemy Core). Changes to them ship as Alembic migrations in `migrations/versions`.

Timestamps are naive UTC `DateTime`s, so SQLite and PostgreSQL store and compare them the same way.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

metadata = MetaData()

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),
    Column("secret_hash", String(64), nullable=False, unique=True),
    Column("models", JSON, nullable=True),  # null: every model
    Column("admin", Boolean, nullable=False, default=False),
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("budget_tokens", BigInteger, nullable=True),
    Column("budget_cost", BigInteger, nullable=True),  # micro-units of the settings' currency
    Column("budget_period", String(16), nullable=False, default="total"),  # total | daily | weekly | monthly
    Column("created_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=True),
    Column("revoked_at", DateTime, nullable=True),
    Column("rotated_at", DateTime, nullable=True),
    Column("last_used_at", DateTime, nullable=True),
)

# The shared counters of a key, kept apart from its definition: every limited request updates this row
# (a row lock in PostgreSQL), while the key itself is read-mostly.
key_counters = Table(
    "key_counters",
    metadata,
    Column("key_id", String(32), ForeignKey("api_keys.id"), primary_key=True),
    Column("rpm_level", Float, nullable=False, default=0.0),  # leaky-bucket fill, requests
    Column("rpm_at", Float, nullable=False, default=0.0),  # epoch seconds of the last fill
    Column("tpm_level", Float, nullable=False, default=0.0),  # leaky-bucket fill, tokens
    Column("tpm_at", Float, nullable=False, default=0.0),
    Column("budget_used", BigInteger, nullable=False, default=0),
    Column("budget_reserved", BigInteger, nullable=False, default=0),
    Column("cost_used", BigInteger, nullable=False, default=0),  # micro-units
    Column("cost_reserved", BigInteger, nullable=False, default=0),
    # The start of the budget period that `budget_used` and `cost_used` count (a periodic budget's); null: never reset.
    Column("period_start", DateTime, nullable=True),
)

# One row per in-flight budget reservation, so a replica that dies mid-request cannot hold budget forever.
reservations = Table(
    "reservations",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("key_id", String(32), ForeignKey("api_keys.id"), nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("cost", BigInteger, nullable=False, default=0),  # micro-units
    Column("created_at", DateTime, nullable=False, index=True),
)

usage = Table(
    "usage",
    metadata,
    Column("id", String(32), primary_key=True),  # generated per call: the ledger's idempotency key
    Column("request_id", String(128), nullable=False, index=True),
    Column("key_id", String(32), nullable=True),
    Column("key_name", String(128), nullable=True),
    Column("endpoint", String(32), nullable=False),
    Column("model", String(256), nullable=False),
    Column("backend", String(64), nullable=False),
    Column("streamed", Boolean, nullable=False),
    Column("status", Integer, nullable=False),
    Column("error", String(128), nullable=True),
    Column("cancelled", Boolean, nullable=False),
    Column("finish_reasons", String(512), nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("cached_tokens", Integer, nullable=False),
    Column("usage_estimated", Boolean, nullable=False),
    Column("ttft_ms", Float, nullable=True),
    Column("latency_ms", Float, nullable=False),
    Column("user", String(256), nullable=True),
    Column("started_at", DateTime, nullable=False),
    Column("ended_at", DateTime, nullable=False),
    Column("batch_id", String(64), nullable=True),  # the batch a line of which this call was
    # What the call cost in micro-units of the settings' currency, at the serving model's prices when it was
    # written; `priced` is false for a model without prices (its cost is 0).
    Column("cost", BigInteger, nullable=False, default=0),
    Column("priced", Boolean, nullable=False, default=False),
    Column("served_model", String(256), nullable=True),  # the fallback model that served `model`, if one did
    Index("ix_usage_started_at", "started_at"),
    Index("ix_usage_key_started", "key_id", "started_at"),
    Index("ix_usage_model_started", "model", "started_at"),
)

# Upstream nodes registered through `/admin/nodes`, applied by every replica and worker. Nodes of the config
# file are never here. `settings` is the registration without its `api_key`, which is kept sealed (Fernet).
registered_nodes = Table(
    "registered_nodes",
    metadata,
    Column("model_id", String(256), primary_key=True),
    Column("name", String(256), primary_key=True),
    Column("settings", JSON, nullable=False),
    Column("api_key_sealed", Text, nullable=True),
    Column("created_at", DateTime, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

# Responses API objects kept for `previous_response_id` and `GET /v1/responses/{id}` (`store: true`), visible
# only to the key that made them. `context` is the conversation before this response's own input, flattened,
# so a continuation needs one row however long its chain is (and outlives a deleted ancestor). A response that a
# node made and keeps (a native relay) has a row naming that `node`, with the gateway's `model` id: the gateway
# knows whose it is and forwards reads of it to the node.
responses = Table(
    "responses",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("key_id", String(32), nullable=True),
    Column("model", String(256), nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=True, index=True),
    Column("response", JSON, nullable=False),
    Column("input_items", JSON, nullable=False),
    Column("context", JSON, nullable=False),
    Column("node", String(256), nullable=True),
)

# Files uploaded for the Batch API (`purpose: batch`) and the output files batches write (`batch_output`),
# with their bytes in the database so every replica reads them. Visible to the key that owns them.
files = Table(
    "files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("key_id", String(32), nullable=True),
    Column("filename", String(512), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=True),
    Column("content", LargeBinary, nullable=False),
    Index("ix_files_key_created", "key_id", "created_at"),
)

# A batch: its state and times as the Batch API shows them. `errors` holds the validation errors of a failed
# batch; the counts and token totals are filled in when the batch ends.
batches = Table(
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("key_id", String(32), nullable=True),
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("metadata", JSON, nullable=True),
    Column("errors", JSON, nullable=True),
    Column("output_file_id", String(64), nullable=True),
    Column("error_file_id", String(64), nullable=True),
    Column("total", Integer, nullable=False, default=0),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    Column("usage", JSON, nullable=True),
    Column("created_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=False),
    Column("in_progress_at", DateTime, nullable=True),
    Column("finalizing_at", DateTime, nullable=True),
    Column("completed_at", DateTime, nullable=True),
    Column("failed_at", DateTime, nullable=True),
    Column("expired_at", DateTime, nullable=True),
    Column("cancelling_at", DateTime, nullable=True),
    Column("cancelled_at", DateTime, nullable=True),
    Index("ix_batches_status", "status"),
    Index("ix_batches_key_created", "key_id", "created_at"),
)

# One row per input line of a batch being run. A replica claims pending lines (`claim`, `claimed_at`) and
# renews its claims while it runs them; a claim left to go stale (its replica died) is taken again. `result`
# is the line's output (or error) line as the output files hold it.
batch_lines = Table(
    "batch_lines",
    metadata,
    Column("batch_id", String(64), nullable=False),
    Column("line", Integer, nullable=False),
    Column("custom_id", String(512), nullable=False),
    Column("body", JSON, nullable=False),
    Column("state", String(12), nullable=False),  # pending | running | done
    Column("claim", String(32), nullable=True),
    Column("claimed_at", DateTime, nullable=True),
    Column("status_code", Integer, nullable=True),
    Column("result", JSON, nullable=True),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("cached_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("reasoning_tokens", Integer, nullable=False, default=0),  # of output_tokens
    PrimaryKeyConstraint("batch_id", "line"),
    Index("ix_batch_lines_state", "batch_id", "state"),
)
