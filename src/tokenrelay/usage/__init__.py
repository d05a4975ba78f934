"""The usage ledger: one row per request, written in batches off the request path, and the reports over it."""
