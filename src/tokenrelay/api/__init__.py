"""The HTTP edge every API dialect shares: the call lifecycle, SSE framing, parsing, and the view of the server."""
