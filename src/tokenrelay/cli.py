"""`tokenrelay serve` (and later subcommands)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tokenrelay import __version__
from tokenrelay.config import Settings, load_settings


class ModelFlag(argparse.Action):
    """`--model PATH` starts a model entry; a following `--model-id NAME` names it."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any, option: str | None = None
    ) -> None:
        models = list(getattr(namespace, "models", None) or [])
        if option == "--model":
            models.append({"path": value})
        elif not models or "id" in models[-1]:
            parser.error("--model-id must follow the --model it names")
        else:
            models[-1]["id"] = value
        namespace.models = models


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenrelay", description="OpenAI-compatible inference gateway")
    parser.add_argument("--version", action="version", version=f"tokenrelay {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the OpenAI-compatible API")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument(
        "--model", action=ModelFlag, dest="models", metavar="PATH.gguf", help="GGUF file to serve (repeatable)"
    )
    serve.add_argument(
        "--model-id", action=ModelFlag, dest="models", metavar="NAME", help="id of the preceding --model"
    )
    serve.add_argument("--config", type=Path, help="YAML config file (also TOKENRELAY_CONFIG)")
    serve.add_argument("--data-dir", type=Path, help="where the default model and databases live")
    serve.add_argument(
        "--chat-template", type=Path, help="Jinja chat template file for models given on the command line"
    )
    serve.add_argument("--slots", type=int, help="sequences decoded together per model")
    serve.add_argument("--ctx-size", type=int, help="context tokens per slot")
    serve.add_argument("--threads", type=int, help="CPU threads for llama.cpp")
    serve.add_argument("--batch-size", type=int, help="tokens per decode step")
    serve.add_argument("--queue-size", type=int, help="requests that may wait for a slot before 503")
    serve.add_argument("--max-n", type=int, help="largest n / best_of a request may ask for")
    serve.add_argument("--log-level", help="debug, info, warning, error")
    return parser


ENGINE_FLAGS = {
    "slots": "slots",
    "ctx_size": "ctx_per_slot",
    "threads": "threads",
    "batch_size": "batch_size",
    "queue_size": "queue_size",
}


def overrides_from(args: argparse.Namespace, base: Settings) -> dict[str, Any]:
    """Command-line values, shaped like the settings tree; flags left out change nothing."""
    out: dict[str, Any] = {}
    for name in ("host", "port", "data_dir", "chat_template", "max_n", "log_level"):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    engine = {key: getattr(args, flag) for flag, key in ENGINE_FLAGS.items() if getattr(args, flag, None) is not None}
    if engine:
        out["engine"] = base.engine.model_copy(update=engine).model_dump()
    if args.models:
        out["models"] = merge_models(base, args.models)
    return out


def merge_models(base: Settings, flags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Command-line models join the configured ones; a command-line model replaces one with the same id."""
    given = [{"id": f.get("id") or Path(f["path"]).stem, "path": f["path"]} for f in flags]
    ids = {m["id"] for m in given}
    kept = [m.model_dump(exclude_none=True) for m in base.models if m.id not in ids]
    return kept + given


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from tokenrelay.app import create_app

    base = load_settings(args.config)
    settings = load_settings(args.config, overrides_from(args, base))
    configure_logging(settings.log_level)
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(), access_log=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args)
    except ValidationError as exc:
        print(f"tokenrelay: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    return 1
