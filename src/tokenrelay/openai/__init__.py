"""The OpenAI-compatible API: a package per endpoint, and what they share (the serving flow, SSE, rendering)."""
