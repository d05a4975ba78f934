"""The OpenAI-compatible API: a package per endpoint, and what chat and completions share (their serving flow
and rendering)."""
