"""The layers of operator/anarchon, read from its imports (ast): no module imports a layer above its own.

Bottom up, each layer of ``anarchon.kube`` imports only the ones below it (and itself)::

    constants       names shared with the API server: nothing of kube
    api             the API server: client, credentials, the list-then-watch loop
    job.spec        the job's vocabulary (JobSpec, run and Pod names): read by every layer above
    report          Kubernetes Events, metrics, health
    run             a run's Pods and its AnarchonRun, the runner, mending, the engine's listener
    job             the AnarchonJob's controller, status, triggers and watch
    main            the wiring

The engine imports nothing of kube, cli or ui, kube nothing of cli or ui; a job's status (a
report) does not mend runs: the controller's resync does. No two modules import each other,
even through others.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "operator"

#: The layers of ``anarchon.kube`` by rank, bottom up: a module's layer is its longest prefix here.
RANKS = {
    "anarchon.kube.constants": 0,
    "anarchon.kube.api": 1,
    "anarchon.kube.job.spec": 2,
    "anarchon.kube.report": 3,
    "anarchon.kube.run": 4,
    "anarchon.kube.job": 5,
    "anarchon.kube.main": 6,
}
#: Edges the ranks allow but the design does not, with why.
FORBIDDEN = {
    ("anarchon.kube.job.status", "anarchon.kube.run.mend"): "mending is the controller's resync's, not the status's",
}
#: Packages that may import none of the others'.
APART = {
    "anarchon.engine": ("anarchon.kube", "anarchon.cli", "anarchon.ui"),
    "anarchon.kube": ("anarchon.cli", "anarchon.ui"),
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under ``root`` (a folder holding the ``anarchon`` package), by dotted name."""
    found = {}
    for path in sorted((root / "anarchon").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The ``anarchon`` modules that ``name`` imports, anywhere in it (a function's imports too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("anarchon"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if not base.startswith("anarchon"):
                continue
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base


def graph(root: Path = ROOT, renamed: Mapping[str, str] | None = None) -> dict[str, set[str]]:
    """Who imports whom among the modules under ``root``; ``renamed`` maps names first (old -> new)."""
    known = modules(root)
    rename = renamed or {}
    return {
        rename.get(m, m): {rename.get(i, i) for i in imports(m, p, known)} - {rename.get(m, m)}
        for m, p in known.items()
    }


def rank(module: str) -> int | None:
    prefixes = [p for p in RANKS if module == p or module.startswith(p + ".")]
    return RANKS[max(prefixes, key=len)] if prefixes else None


def upward(edges: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """The modules that import upward (or across a forbidden edge), with what they import so."""
    found: dict[str, list[str]] = {}
    for module, targets in edges.items():
        for target in sorted(targets):
            low, high = rank(module), rank(target)
            wrong = (low is not None and high is not None and high > low) or (module, target) in FORBIDDEN
            wrong |= any(module.startswith(pkg) and target.startswith(others) for pkg, others in APART.items())
            if wrong:
                found.setdefault(module, []).append(target)
    return found


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The modules that import each other, through others or not: each such group (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward(graph()) == {}


def test_no_two_modules_import_each_other() -> None:
    assert cycles(graph()) == []


def test_every_kube_module_has_a_layer() -> None:
    """A new folder or top-level module of kube is given its place here, not left out of the check."""
    assert [m for m in modules() if m.startswith("anarchon.kube.") and rank(m) is None] == []


def test_the_check_sees_an_upward_import_and_a_cycle() -> None:
    """The check can fail: a runner's module that imported the job's controller would be both."""
    edges = graph()
    edges["anarchon.kube.run.held"].add("anarchon.kube.job.controller")
    assert "anarchon.kube.job.controller" in upward(edges).get("anarchon.kube.run.held", [])
    assert any("anarchon.kube.run.held" in group for group in cycles(edges))
