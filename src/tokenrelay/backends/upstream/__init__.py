"""Upstream nodes: any OpenAI-compatible server behind a model id, with routing, health and failover."""
