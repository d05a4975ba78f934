"""Alembic environment: runs on the connection `tokenrelay.store.migrate` hands over (never from alembic.ini)."""

from __future__ import annotations

from alembic import context

from tokenrelay.store.schema import metadata

connection = context.config.attributes["connection"]
# Batch mode lets later migrations alter tables on SQLite, which has almost no ALTER TABLE.
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
