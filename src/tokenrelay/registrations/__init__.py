"""Upstream nodes registered at run time (`/admin/nodes`): kept in the database, applied by every process."""
