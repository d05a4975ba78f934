"""Anthropic's APIs, served over the same backends, keys, limits and ledger as the OpenAI ones."""
