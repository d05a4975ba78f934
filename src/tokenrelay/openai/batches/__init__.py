"""`/v1/batches`: OpenAI's Batch API, run by this server on its own models."""
