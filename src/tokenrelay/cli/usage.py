"""`tokenrelay usage`: totals from the ledger, filtered and grouped."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from tokenrelay.cli.tables import render_table
from tokenrelay.config import Settings
from tokenrelay.store.opened import opened_database
from tokenrelay.store.timeutil import parse_instant
from tokenrelay.usage.report import GROUPINGS, UsageQuery, usage_report

FIGURES = ("requests", "prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens", "failed", "cancelled")
COSTS = ("cost", "unpriced_requests")
LABELS = {"key": ("key_id", "key_name"), "model": ("model",), "day": ("day",)}


def add_usage_command(commands: Any, store_options: argparse.ArgumentParser) -> None:
    usage = commands.add_parser("usage", parents=[store_options], help="token and cost totals from the ledger")
    usage.add_argument("--key", help="key id or name")
    usage.add_argument("--model")
    usage.add_argument("--since", type=parse_instant, help="start date (UTC), e.g. 2026-01-01")
    usage.add_argument("--by", choices=GROUPINGS, help="one line per key, model or day")
    usage.add_argument("--json", action="store_true")


def run_usage(args: argparse.Namespace, settings: Settings) -> int:
    query = UsageQuery(key=args.key, model=args.model, since=args.since, by=args.by)
    report = asyncio.run(_report(settings, query))
    print(json.dumps(report) if args.json else render_report(report, args.by))
    if not args.json and report["totals"]["unpriced_requests"]:
        print(unpriced_note(report))
    return 0


async def _report(settings: Settings, query: UsageQuery) -> dict[str, Any]:
    async with opened_database(settings) as engine:
        return await usage_report(engine, query, settings.currency)


def render_report(report: dict[str, Any], by: str | None) -> str:
    labels = LABELS[by] if by else ()
    figures = (*FIGURES, *COSTS)
    rows = [[g[name] for name in (*labels, *figures)] for g in report["groups"]]
    total = report["totals"]
    rows.append([*(["total"] + [""] * (len(labels) - 1) if labels else []), *(total[f] for f in figures)])
    headers = [*labels, *FIGURES, f"cost_{report['currency']}", "unpriced"]
    return render_table(headers, rows)


def unpriced_note(report: dict[str, Any]) -> str:
    totals = report["totals"]
    return (
        f"{totals['unpriced_requests']} of {totals['requests']} requests were served by models without prices: "
        "their cost counts as 0 (set `pricing:` on the model to price them)"
    )
