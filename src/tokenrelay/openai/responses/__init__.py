"""`/v1/responses`: OpenAI's Responses API, answered by translating to chat (see `serving.py`, `router.py`)."""
