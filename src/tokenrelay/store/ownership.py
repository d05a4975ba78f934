"""Who may see a stored file or batch: the key that made it; the admin key sees all."""

from __future__ import annotations

from sqlalchemy import ColumnElement, Table, true

from tokenrelay.principal import Principal


def visible_to(table: Table, principal: Principal) -> ColumnElement[bool]:
    if principal.admin:
        return true()
    if principal.key_id is None:  # a server running open: what nobody's key made
        return table.c.key_id.is_(None)
    return table.c.key_id == principal.key_id
