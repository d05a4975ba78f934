"""What an operator sees of a running server: logging, the request log line, Prometheus metrics, startup progress."""
