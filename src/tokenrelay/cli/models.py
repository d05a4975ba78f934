"""`tokenrelay models list | load ID | unload ID`: a running server's engine models, through its admin API."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any

from tokenrelay.cli.tables import render_table
from tokenrelay.config import Settings
from tokenrelay.errors import APIError

COLUMNS = ("id", "state", "pinned", "memory_mib", "context_length", "in_flight", "loads", "unloads")


def add_models_command(commands: Any, store_options: argparse.ArgumentParser) -> None:
    models = commands.add_parser("models", parents=[store_options], help="list, load or unload a server's models")
    models.add_argument("action", choices=("list", "load", "unload"))
    models.add_argument("model", nargs="?", help="the model id (load and unload)")
    models.add_argument("--url", help="the server (default: http://HOST:PORT of the settings)")
    models.add_argument("--json", action="store_true")


def run_models(args: argparse.Namespace, settings: Settings) -> int:
    if args.action != "list" and not args.model:
        raise APIError(f"`models {args.action}` needs a model id")
    if settings.admin_key is None:
        raise APIError("no admin key: set TOKENRELAY_ADMIN_KEY (or admin_key in the config)")
    base = (args.url or f"http://{settings.host}:{settings.port}").rstrip("/")
    path = "/admin/models" if args.action == "list" else f"/admin/models/{args.model}/{args.action}"
    body = _call(base + path, "GET" if args.action == "list" else "POST", settings.admin_key.get_secret_value())
    rows = body["data"] if args.action == "list" else [body]
    if args.json:
        print(json.dumps(body))
        return 0
    table = [[row.get(c) if c != "memory_mib" else row.get("memory_bytes", 0) >> 20 for c in COLUMNS] for row in rows]
    print(render_table(COLUMNS, table))
    return 0


def _call(url: str, method: str, admin_key: str) -> dict[str, Any]:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {admin_key}"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:  # a load may take minutes
            answer: dict[str, Any] = json.load(response)
            return answer
    except urllib.error.HTTPError as exc:
        raise APIError(_error_message(exc)) from None
    except urllib.error.URLError as exc:
        raise APIError(f"cannot reach {url}: {exc.reason}") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(exc)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {exc.code}"
