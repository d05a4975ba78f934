"""Ids of responses and their items: a type prefix and a time-ordered hex id (`resp_...`, `msg_...`, `fc_...`)."""

from __future__ import annotations

from tokenrelay.store.ids import time_ordered_id


def new_id(prefix: str) -> str:
    return f"{prefix}_{time_ordered_id()}"
