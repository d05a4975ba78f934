"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API as chat completions."""
