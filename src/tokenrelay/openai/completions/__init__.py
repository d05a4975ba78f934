"""`POST /v1/completions`: the endpoint and its JSON and SSE bodies."""
