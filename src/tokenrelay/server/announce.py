"""The startup line an operator looks for: where the server listens and which models it serves."""

from __future__ import annotations

import logging

from tokenrelay.backends.base import Backend

log = logging.getLogger("tokenrelay.serve")

WILDCARD_HOSTS = {"0.0.0.0", "::", ""}


def base_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def describe_models(backends: list[Backend]) -> str:
    return ", ".join(f"{b.card.id} ({b.kind})" for b in backends) or "no models"


def announce(host: str, port: int, backends: list[Backend]) -> None:
    url = base_url(host, port)
    where = f"{url}, all interfaces" if host in WILDCARD_HOSTS else url
    log.info("serving %s", describe_models(backends))
    log.info("listening on %s (playground /, usage /console/usage, API /v1, metrics /metrics)", where)
