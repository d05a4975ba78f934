"""The running server: the ASGI app, what it holds (services), uvicorn wiring, request ids, worker processes."""
