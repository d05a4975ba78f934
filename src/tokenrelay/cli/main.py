"""`tokenrelay serve | keys ... | usage`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tokenrelay import __version__
from tokenrelay.cli.keys import add_keys_commands, run_keys
from tokenrelay.cli.models import add_models_command, run_models
from tokenrelay.cli.problems import problem_lines
from tokenrelay.cli.pull import add_pull_command, run_pull
from tokenrelay.cli.usage import add_usage_command, run_usage
from tokenrelay.config import Settings, load_settings
from tokenrelay.errors import APIError
from tokenrelay.models.source import default_model_id, is_hub_source
from tokenrelay.observability.logs import configure_logging


class ModelFlag(argparse.Action):
    """`--model PATH` (or `--model hf:org/repo...`) starts a model entry; a following `--model-id NAME` names it."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any, option: str | None = None
    ) -> None:
        models = list(getattr(namespace, "models", None) or [])
        if option == "--model":
            models.append({"source": value} if is_hub_source(value) else {"path": value})
        elif not models or "id" in models[-1]:
            parser.error("--model-id must follow the --model it names")
        else:
            models[-1]["id"] = value
        namespace.models = models


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenrelay", description="OpenAI-compatible inference gateway")
    parser.add_argument("--version", action="version", version=f"tokenrelay {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    store = store_options()
    serve = commands.add_parser("serve", parents=[store], help="serve the OpenAI-compatible API")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument(
        "--model",
        action=ModelFlag,
        dest="models",
        metavar="PATH.gguf",
        help="GGUF file, or hf:org/repo[:QUANT|:FILE] from the Hugging Face Hub, to serve (repeatable)",
    )
    serve.add_argument(
        "--model-id", action=ModelFlag, dest="models", metavar="NAME", help="id of the preceding --model"
    )
    serve.add_argument(
        "--chat-template", type=Path, help="Jinja chat template file for models given on the command line"
    )
    serve.add_argument("--slots", type=int, help="sequences decoded together per model")
    serve.add_argument("--ctx-size", type=int, help="context tokens per slot")
    serve.add_argument("--long-slots", type=int, help="slots with the model's whole context (default 1)")
    serve.add_argument("--max-context", type=int, help="a long slot's context (default: the model's, at most 32768)")
    serve.add_argument("--threads", type=int, help="CPU threads for llama.cpp")
    serve.add_argument("--queue-size", type=int, help="requests that may wait for a slot before 503")
    serve.add_argument("--prefill-chunk", type=int, help="prompt tokens per step while others decode")
    serve.add_argument("--kv-type", choices=["q8_0", "f16"], help="KV cache precision (q8_0: batch-invariant)")
    serve.add_argument("--max-n", type=int, help="largest n / best_of a request may ask for")
    serve.add_argument("--log-level", help="debug, info, warning, error")
    serve.add_argument("--api-key", help="a static key accepted on /v1 (prefer TOKENRELAY_API_KEY: flags show in ps)")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=None,
        help="serve on a non-loopback address even though no API key exists",
    )
    serve.add_argument(
        "--workers", type=int, help="server processes sharing the port (default 1; upstream-only models)"
    )
    serve.add_argument("--shutdown-timeout", type=float, help="seconds in-flight requests get on shutdown (default 30)")
    serve.add_argument("--log-format", choices=["text", "json"], help="text (default) or one JSON object per line")
    serve.add_argument(
        "--redis-url", help="redis://host:port/db: count --rpm/--tpm limits there, shared by every replica"
    )
    serve.add_argument(
        "--metrics-require-admin", action="store_true", default=None, help="serve /metrics only with the admin key"
    )
    add_keys_commands(commands, store)
    add_usage_command(commands, store)
    add_pull_command(commands)
    add_models_command(commands, store)
    return parser


def store_options() -> argparse.ArgumentParser:
    """Options every command that touches the settings or the database shares."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--config", type=Path, help="YAML config file (also TOKENRELAY_CONFIG)")
    options.add_argument("--data-dir", type=Path, help="where the default model and databases live")
    options.add_argument("--database-url", help="sqlite:///path or postgresql://user@host/db (default: data dir)")
    return options


SETTING_FLAGS = (
    "host",
    "port",
    "data_dir",
    "chat_template",
    "max_n",
    "log_level",
    "log_format",
    "metrics_require_admin",
    "database_url",
    "redis_url",
    "api_key",
    "insecure_no_auth",
    "shutdown_timeout",
    "workers",
)


ENGINE_FLAGS = {
    "slots": "slots",
    "ctx_size": "ctx_per_slot",
    "long_slots": "long_slots",
    "max_context": "max_context",
    "threads": "threads",
    "queue_size": "queue_size",
    "prefill_chunk": "prefill_chunk",
    "kv_type": "kv_type",
}


def overrides_from(args: argparse.Namespace, base: Settings) -> dict[str, Any]:
    """Command-line values, shaped like the settings tree; flags left out change nothing."""
    out: dict[str, Any] = {}
    for name in SETTING_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    engine = {key: getattr(args, flag) for flag, key in ENGINE_FLAGS.items() if getattr(args, flag, None) is not None}
    if engine:
        out["engine"] = base.engine.model_copy(update=engine).model_dump()
    if getattr(args, "models", None):
        out["models"] = merge_models(base, args.models)
    return out


def merge_models(base: Settings, flags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Command-line models join the configured ones; a command-line model replaces one with the same id."""
    given = [{**f, "id": f.get("id") or flag_model_id(f)} for f in flags]
    ids = {m["id"] for m in given}
    kept = [m.model_dump(exclude_none=True) for m in base.models if m.id not in ids]
    return kept + given


def flag_model_id(flag: dict[str, Any]) -> str:
    """A command-line model's id when no --model-id names it: the GGUF's stem, or the Hub repo's name lowercased."""
    return default_model_id(flag["source"]) if "source" in flag else Path(flag["path"]).stem


def serve(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    # A GGUF path that names no file is the commonest slip: one line now, not a traceback once the server starts.
    for model in settings.served_models():
        if model.path is not None and not model.path.is_file():
            print(f"tokenrelay: model {model.id!r}: no GGUF file at {model.path}", file=sys.stderr)
            return 2
    configure_logging(settings.log_level, settings.log_format)
    if settings.workers > 1:
        return serve_several(settings)
    return serve_one(settings)


def serve_several(settings: Settings) -> int:
    from tokenrelay.server.workers.supervisor import EmbeddedModelsWithWorkers, serve_workers

    try:
        return serve_workers(settings)
    except EmbeddedModelsWithWorkers as exc:
        print(f"tokenrelay: {exc}", file=sys.stderr)
        return 2


def serve_one(settings: Settings) -> int:
    import uvicorn

    from tokenrelay.server.app import create_app
    from tokenrelay.server.uvicorn_options import uvicorn_options

    app = create_app(settings)
    uvicorn.run(app, **uvicorn_options(settings))
    return 0


def settings_for(args: argparse.Namespace) -> Settings:
    base = load_settings(args.config)
    return load_settings(args.config, overrides_from(args, base))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            return serve(args)
        except ValidationError as exc:
            return invalid_settings(exc)
    if args.command == "pull":
        return run_pull(args)
    try:
        settings = settings_for(args)
    except ValidationError as exc:
        return invalid_settings(exc)
    configure_logging("warning")
    try:
        runs = {"keys": run_keys, "usage": run_usage, "models": run_models}
        return runs[args.command](args, settings)
    except ValidationError as exc:
        print(f"tokenrelay {args.command}: {problem_lines(exc)[0]}", file=sys.stderr)
        return 2
    except APIError as exc:
        print(f"tokenrelay {args.command}: {exc.message}", file=sys.stderr)
        return 1


def invalid_settings(exc: ValidationError) -> int:
    for line in problem_lines(exc):
        print(f"tokenrelay: invalid settings: {line}", file=sys.stderr)
    return 2
