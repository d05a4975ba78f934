"""Per-key rate limits (requests and tokens per minute) and token budgets, shared through the database."""
