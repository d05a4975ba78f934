"""`tokenrelay pull hf:org/repo[:TAG|:FILE]`: a GGUF into the Hugging Face cache, for serving it later offline."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tokenrelay.models.source import FORM


def add_pull_command(commands: Any) -> None:
    pull = commands.add_parser(
        "pull", help="download a GGUF from the Hugging Face Hub into its cache and print its path"
    )
    pull.add_argument("source", metavar="hf:ORG/REPO[:TAG|:FILE]", help=FORM)


def run_pull(args: argparse.Namespace) -> int:
    # Here, not at the top: the other commands need not import huggingface_hub and its HTTP client.
    from tokenrelay.models.hub import HubError, model_file

    try:
        path = model_file(args.source)
    except (ValueError, HubError) as exc:
        print(f"tokenrelay pull: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
