"""The import rule: every package imports only the packages below it.

    bench → stack → workers → producer.contract
                  → producer.cli → producer.api → producer.batches → producer.client
                                                                   → producer.errors → producer.contract

Read from the source with ``ast`` (nothing is imported), so a lazy import inside a function
counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package → the first-party packages it may import (besides itself and its own modules).
ALLOWED: dict[str, set[str]] = {
    "producer.contract": set(),
    "producer.errors": {"producer.contract"},
    "producer.client": {"producer.contract", "producer.errors"},
    "producer.batches": {"producer.contract", "producer.errors", "producer.client"},
    "producer.api": {"producer.contract", "producer.errors", "producer.client", "producer.batches"},
    "producer.cli": {
        "producer.contract",
        "producer.errors",
        "producer.client",
        "producer.batches",
        "producer.api",
    },
    "producer": {"producer.contract", "producer.errors", "producer.client"},  # producer/__init__.py
    "workers": {"producer.contract"},
    "stack": {"producer", "workers"},
    "bench": {"producer", "workers", "stack"},
}
FIRST_PARTY = ("producer", "workers", "stack", "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_of(path.read_text(encoding="utf-8"), package)


def imports_of(source: str, package: str) -> set[str]:
    """Every first-party name the source imports, relative imports resolved against package."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from producer import contract` imports producer.contract, not just producer.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in FIRST_PARTY}


def owner(module: str) -> str:
    """The most specific package of ALLOWED that holds the module."""
    candidates = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    return max(candidates, key=len)


def may_import(mine: str, theirs: str) -> bool:
    return theirs == mine or any(theirs == a or theirs.startswith(a + ".") for a in ALLOWED[mine])


def sources() -> list[Path]:
    return sorted(p for top in FIRST_PARTY for p in (ROOT / top).rglob("*.py"))


def test_every_package_of_the_tree_has_a_rule() -> None:
    tops = {p.name for p in (ROOT / "producer").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {f"producer.{t}" for t in tops} <= set(ALLOWED)


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path: Path) -> None:
    mine = owner(module_name(path))
    wrong = []
    for target in sorted(imported(path)):
        theirs = owner(target)
        if not may_import(mine, theirs):
            wrong.append(f"{target} ({theirs})")
    assert not wrong, f"{module_name(path)} ({mine}) may import only {sorted(ALLOWED[mine])}: {wrong}"


def test_the_rule_reports_a_worker_reaching_into_the_client() -> None:
    source = "from producer.client import Client\nfrom producer.contract import Keys\n"
    targets = imports_of(source, "workers")
    assert targets == {"producer.client.Client", "producer.contract.Keys"}
    assert [t for t in sorted(targets) if not may_import("workers", owner(t))] == ["producer.client.Client"]


def test_the_rule_resolves_relative_imports_and_lazy_ones() -> None:
    source = "def f():\n    from ..api import create_app\n    from . import lines\n"
    assert imports_of(source, "producer.batches") == {"producer.api.create_app", "producer.batches.lines"}
    assert not may_import("producer.batches", owner("producer.api.create_app"))


def readme_layout() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1]
    return section.split("```", 2)[1]


@pytest.mark.parametrize("top", ["producer", "workers"])
def test_the_readme_layout_names_every_module(top: str) -> None:
    # Every file in `ls -R producer workers` but the __init__/__main__ of each package.
    layout = set(readme_layout().split())
    files = [
        p
        for p in (ROOT / top).rglob("*")
        if p.suffix in (".py", ".lua") and p.name not in ("__init__.py", "__main__.py")
    ]
    missing = sorted(str(p.relative_to(ROOT)) for p in files if p.name not in layout)
    assert not missing, f"README's layout leaves out {missing}"
    dirs = sorted(p.name + "/" for p in (ROOT / top).iterdir() if (p / "__init__.py").exists())
    assert set(dirs) <= layout, f"README's layout leaves out packages {dirs}"


def test_the_readme_layout_names_no_module_that_is_gone() -> None:
    tree = readme_layout().split("model_repository/", 1)[0]  # the producer/ and workers/ part
    named = {w for w in tree.split() if w.endswith((".py", ".lua"))}
    present = {p.name for top in ("producer", "workers") for p in (ROOT / top).rglob("*")}
    assert named <= present, f"README's layout names missing files {sorted(named - present)}"


def test_the_import_linter_contracts_are_kept() -> None:
    """pyproject's [tool.importlinter]: worker rooms import downwards, workers only the contract."""
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert " 0 broken" in run.stdout and " kept" in run.stdout


MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    """One concept per module: past 400 lines a module holds several (split it by concept)."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
