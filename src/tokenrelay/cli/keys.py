"""`tokenrelay keys create | list | revoke | rotate`."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from tokenrelay.auth.keyspec import KeyCreate
from tokenrelay.auth.keystore import KeyRecord, KeyStore
from tokenrelay.cli.tables import render_table
from tokenrelay.config import Settings
from tokenrelay.limits.periods import PERIODS
from tokenrelay.store.opened import opened_database


def add_keys_commands(commands: Any, store_options: argparse.ArgumentParser) -> None:
    keys = commands.add_parser("keys", help="create, list, revoke and rotate API keys")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", parents=[store_options], help="create a key and print its secret once")
    create.add_argument("--name", required=True)
    create.add_argument("--models", dest="key_models", help="comma-separated model ids this key may use (default: all)")
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute (prompt + completion)")
    create.add_argument("--budget-tokens", type=int, help="tokens this key may use per budget period")
    create.add_argument("--budget-cost", help="money this key may spend per budget period (e.g. 25.50)")
    create.add_argument("--budget-period", choices=PERIODS, default="total", help="when the spend starts again from 0")
    create.add_argument("--expires", help="30d, 12h, 2w ... from now, or a date (2026-12-31)")
    create.add_argument("--admin", action="store_true", help="may use /admin/* (keys and usage)")
    create.add_argument("--json", action="store_true", help="print one JSON object")
    listing = actions.add_parser("list", parents=[store_options], help="list keys (never their secrets)")
    listing.add_argument("--json", action="store_true")
    for name, text in (("revoke", "revoke a key at once"), ("rotate", "replace a key's secret, keeping its limits")):
        action = actions.add_parser(name, parents=[store_options], help=text)
        action.add_argument("ref", metavar="ID|NAME")
        action.add_argument("--json", action="store_true")


def run_keys(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run(args, settings))


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    async with opened_database(settings) as engine:
        store = KeyStore(engine)
        if args.action == "create":
            record, secret = await store.create(_wanted(args).spec())
            _print_secret("created", record, secret, args.json, settings.currency)
        elif args.action == "list":
            _print_list(await store.list(), args.json)
        elif args.action == "revoke":
            record = await store.revoke(args.ref)
            print(json.dumps(record.to_json()) if args.json else f"revoked key {record.name} ({record.id})")
        else:
            record, secret = await store.rotate(args.ref)
            _print_secret("rotated", record, secret, args.json, settings.currency)
    return 0


def _wanted(args: argparse.Namespace) -> KeyCreate:
    given = args.key_models
    models = [m.strip() for m in given.split(",") if m.strip()] if given is not None else None
    return KeyCreate(
        name=args.name,
        models=models,
        rpm=args.rpm,
        tpm=args.tpm,
        budget_tokens=args.budget_tokens,
        budget_cost=args.budget_cost,
        budget_period=args.budget_period,
        expires=args.expires,
        admin=args.admin,
    )


def _print_secret(verb: str, record: KeyRecord, secret: str, as_json: bool, currency: str) -> None:
    if as_json:
        print(json.dumps({**record.to_json(), "key": secret}))
        return
    info = record.to_json()
    print(f"{verb} key {record.name} ({record.id}){' [admin]' if record.admin else ''}")
    print(f"  models: {', '.join(record.models) if record.models else 'all'}")
    print(f"  limits: rpm {record.rpm or '-'}, tpm {record.tpm or '-'}")
    budget = f"{info['budget_tokens'] or '-'} tokens, {info['budget_cost'] or '-'} {currency}"
    print(f"  budget ({record.budget_period}): {budget}")
    print(f"  expires: {info['expires_at'] or 'never'}")
    print("The secret is shown only this once; store it now. The last line is the key alone:")
    print(secret)


LIST_COLUMNS = (
    "id",
    "name",
    "prefix",
    "models",
    "admin",
    "rpm",
    "tpm",
    "budget_period",
    "budget_tokens",
    "budget_used",
    "budget_cost",
    "cost_used",
    "resets_at",
)
LIST_DATES = ("created_at", "last_used_at", "expires_at", "revoked_at")


def _print_list(records: list[KeyRecord], as_json: bool) -> None:
    if as_json:
        print(json.dumps([r.to_json() for r in records]))
        return
    rows = []
    for record in records:
        info = record.to_json()
        rows.append([info[c] for c in LIST_COLUMNS] + [info[c] for c in LIST_DATES])
    headers = [
        *LIST_COLUMNS[:-6],
        "period",
        "budget",
        "used",
        "budget cost",
        "cost used",
        "resets",
        "created",
        "last used",
        "expires",
        "revoked",
    ]
    print(render_table(headers, rows))
