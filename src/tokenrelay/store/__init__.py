"""The database behind keys, limits and the usage ledger: SQLite by default, PostgreSQL for several replicas."""
