"""The chart README, generated from values.yaml by charts/readme.py: up to date, complete, exact."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.chart.chartlib import CHART, helm

SCRIPT = CHART.parent / "readme.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("charts_readme", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


gen = _script()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_readme_is_up_to_date() -> None:
    res = run("--check")
    assert res.returncode == 0, f"{res.stderr}: run python3 charts/readme.py"


def test_a_changed_comment_makes_it_stale_until_regenerated(tmp_path: Path) -> None:
    chart = tmp_path / "anarchon"
    chart.mkdir()
    for name in ("Chart.yaml", "values.yaml", "README.md"):
        shutil.copy(CHART / name, chart / name)
    values = (chart / "values.yaml").read_text()
    old = "# -- Log format: plain or json."
    assert old in values
    (chart / "values.yaml").write_text(values.replace(old, "# -- Log format: plain or json (a new word)."))
    res = run("--check", "--chart", str(chart))
    assert res.returncode == 1 and "is stale" in res.stderr, res.stderr
    assert run("--chart", str(chart)).returncode == 0
    assert (
        '| `operator.logFormat` | string | `"json"` | Log format: plain or json (a new word). |'
        in (chart / "README.md").read_text()
    )
    assert run("--check", "--chart", str(chart)).returncode == 0


def leaves(values: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(values, dict) and values:
        return {k: v for name, sub in values.items() for k, v in leaves(sub, f"{prefix}{name}.").items()}
    return {prefix.removesuffix("."): values}


def at(values: Any, key: str) -> Any:
    for part in key.split("."):
        values = values[part]
    return values


def table() -> dict[str, tuple[str, str, str]]:
    """key -> (type, default, description), read back from the README's markdown table."""
    out = {}
    for line in (CHART / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            key, type_, default, description = [c.strip() for c in line.strip("|").split(" | ")]
            out[key.strip("`")] = (type_, default, description)
    return out


def test_every_value_has_a_row_with_its_exact_default_and_a_description() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = table()
    for leaf in leaves(values):
        assert any(leaf == key or leaf.startswith(f"{key}.") for key in rows), f"{leaf} is not in the README"
    for key, (_type, default, description) in rows.items():
        assert description, f"{key} has no description: add a `# --` comment above it in values.yaml"
        if default:
            assert json.loads(default.strip("`")) == at(values, key), key
    assert rows["replicaCount"] == (
        "int",
        "`3`",
        "Operator replicas. All of them are active: for every slot of every job they compete through the "
        "store, one wins and runs it, the others stand by as backups and take over if the winner dies. "
        "Three replicas survive one node failure during a rolling update.",
    )


def test_comments_belong_to_the_next_key_only() -> None:
    text = "\n".join(
        [
            "# Header, not a description.",
            "",
            "# -- First line,",
            "# second line.",
            "top:",
            "  # -- Nested.",
            "  inner: 1",
            "  # -- Dropped by the blank line.",
            "",
            "  plain: 2",
            "list:",
            "  # -- Dropped by the list item.",
            "  - a",
            "after: 3",
        ]
    )
    assert gen.comments(text) == {"top": "First line, second line.", "top.inner": "Nested."}


def test_helm_show_readme_shows_it() -> None:
    res = helm("show", "readme", str(CHART))
    assert res.stdout.strip() == (CHART / "README.md").read_text().strip()
