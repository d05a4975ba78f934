"""`POST /v1/chat/completions`: the endpoint and its JSON and SSE bodies."""
