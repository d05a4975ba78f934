"""One API call's life: its record, reporting it when it ends, and the accounting of keys, limits and the ledger."""
