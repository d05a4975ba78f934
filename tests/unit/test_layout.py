"""The package's shape as `docs/architecture.md` states it, checked against the source's own imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tokenrelay

SRC = Path(tokenrelay.__file__).parent
DIALECTS = frozenset({"openai", "anthropic", "admin"})
ABOVE_THE_EDGE = DIALECTS | {"api", "server", "cli", "apidoc", "console"}
# What serves requests without knowing any API: the engine and nodes, a call's record, keys, limits, the ledger.
BELOW_THE_EDGE = ("backends", "calls", "limits", "auth", "usage", "store", "protocol", "pricing", "registrations")


def modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def run_time_imports(path: Path) -> set[str]:
    """The tokenrelay packages (or loose modules) `path` imports when it runs: `if TYPE_CHECKING:` blocks left out."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tokenrelay."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("tokenrelay.")}
    return names


def crossings(package: str, forbidden: frozenset[str] | set[str]) -> set[str]:
    """`module -> package` for each import from `package` of one of `forbidden`."""
    return {
        f"{path.relative_to(SRC)} -> {name}" for path in modules(package) for name in run_time_imports(path) & forbidden
    }


def reads_server_state(path: Path) -> bool:
    """Whether `path` reaches the running server through the app's state (`<app>.state.services`)."""
    for node in ast.walk(ast.parse(path.read_text())):
        inner = node.value if isinstance(node, ast.Attribute) and node.attr == "services" else None
        if isinstance(inner, ast.Attribute) and inner.attr == "state":
            return True
    return False


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_a_dialect_imports_the_edge_never_another_dialect(dialect: str) -> None:
    assert not crossings(dialect, DIALECTS - {dialect})


def test_the_edge_imports_no_dialect_and_not_the_server() -> None:
    assert not crossings("api", ABOVE_THE_EDGE - {"api"})


@pytest.mark.parametrize("package", BELOW_THE_EDGE)
def test_nothing_below_the_edge_imports_an_api_package(package: str) -> None:
    assert not crossings(package, ABOVE_THE_EDGE)


def test_only_the_edge_reads_the_running_server_from_the_app() -> None:
    readers = {str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if reads_server_state(path)}
    assert readers == {"api/server.py"}
