"""Wire models for the OpenAI-compatible API. They know nothing about engines."""
