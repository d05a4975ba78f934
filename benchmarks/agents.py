"""Coding agents against a real tokenrelay, end to end: Codex CLI (`codex exec`, Responses API) and Claude Code
(`claude -p`, Messages API) each asked for one turn, with their own default settings.

Run from a checkout: `python benchmarks/agents.py` (needs `npm i @openai/codex @anthropic-ai/claude-code` in
`--npm-dir`). It starts `tokenrelay serve` with its defaults (or uses `--url`), points each
CLI at it (a custom Codex provider with `wire_api = "responses"`; `ANTHROPIC_BASE_URL` for Claude Code, its
non-essential traffic off), and prints what each answered and how long it took. Not part of the test run: a
first turn evaluates the agent's whole prompt (about 9,000 tokens for Codex, 21,000 for Claude Code).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CODEX_CONFIG = """model = "{model}"
model_provider = "tokenrelay"

[model_providers.tokenrelay]
name = "tokenrelay"
base_url = "{url}/v1"
env_key = "TOKENRELAY_API_KEY"
wire_api = "responses"
"""
ASK = "Reply with the single word: ready"


def serve(work: Path, context: int | None) -> tuple[subprocess.Popen[bytes], str]:
    port = 18741
    command = [sys.executable, "-m", "tokenrelay", "serve", "--port", str(port), "--data-dir", str(work / "data")]
    command += ["--max-context", str(context)] if context is not None else []
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(1)
    process.kill()
    raise SystemExit("tokenrelay did not start")


def run(name: str, command: list[str], env: dict[str, str], cwd: Path, timeout: float) -> None:
    started = time.monotonic()
    try:
        done = subprocess.run(command, env=os.environ | env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        outcome = f"exit {done.returncode}; last lines: {done.stdout.strip().splitlines()[-3:]}"
    except subprocess.TimeoutExpired:
        outcome = "timed out"
    print(f"{name:<12} {time.monotonic() - started:7.1f} s  {outcome}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running tokenrelay (default: start one)")
    parser.add_argument("--npm-dir", type=Path, default=Path.cwd(), help="where the CLIs are installed")
    parser.add_argument("--context", type=int, help="the started server's --max-context (default: the model's)")
    # Codex's prompt is about 9,000 of SmolLM2's tokens, more than its 8,192: Gemma's context holds it.
    parser.add_argument("--codex-model", default="gemma-3-270m")
    parser.add_argument("--claude-model", default="gemma-3-270m")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    bin_dir = args.npm_dir / "node_modules" / ".bin"
    with tempfile.TemporaryDirectory(prefix="tokenrelay-agents-") as tmp:
        work = Path(tmp)
        server, url = (None, args.url) if args.url else serve(work, args.context)
        try:
            codex_home = work / "codex"
            codex_home.mkdir()
            (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=args.codex_model, url=url))
            codex_env = {"CODEX_HOME": str(codex_home), "TOKENRELAY_API_KEY": "none"}
            codex = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", ASK]
            run("codex", codex, codex_env, work, args.timeout)
            claude_env = {
                "HOME": str(work),
                "ANTHROPIC_BASE_URL": url,
                "ANTHROPIC_API_KEY": "none",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            }
            claude = [str(bin_dir / "claude"), "-p", ASK, "--model", args.claude_model]
            run("claude-code", claude, claude_env, work, args.timeout)
        finally:
            if server is not None:
                server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
