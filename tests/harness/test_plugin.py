"""The spread over pytest-xdist workers (plugin.py), on a tree of tiny tests run by a pytest of its own:
a file's tests share a worker, the Docker tests share one, and a Docker test elsewhere is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.harness.controlplane import REPO
from tests.harness.plugin import group_of

#: Each tiny test writes "<its id> <its worker>" to the file named by $WHERE.
RECORD = """
import os

def _record(name):
    with open(os.environ["WHERE"], "a") as out:
        out.write(f"{__name__}.{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

def test_one():
    _record("one")

def test_two():
    _record("two")

def test_three():
    _record("three")
"""


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'operator'}", "WHERE": str(root / "where.txt")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.harness.plugin", "-q", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_group_of() -> None:
    assert group_of("tests/image/test_image.py::test_x") == "docker"
    assert group_of("tests/operator/test_real_node.py::test_y[a::b]") == "docker"
    assert group_of("tests/operator/test_operator.py::test_z[sqlite]") == "tests/operator/test_operator.py"


def test_a_files_tests_share_a_worker_and_the_docker_tests_share_one(tmp_path: Path) -> None:
    files = ["tests/image/test_a.py", "tests/operator/test_real_node.py"]
    files += [f"tests/engine/test_e{i}.py" for i in range(4)]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(RECORD)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the tree is its own rootdir
    res = _pytest(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert res.returncode == 0, res.stdout + res.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for line in (tmp_path / "where.txt").read_text().splitlines():
        test, worker = line.split()
        workers[test.rsplit(".", 1)[0]].add(worker)
    assert len(workers) == len(files), workers
    assert all(len(w) == 1 for w in workers.values()), workers  # each file on one worker
    assert workers["test_a"] == workers["test_real_node"], workers  # the Docker tests together
    assert len(set().union(*workers.values())) > 1, workers  # and the rest spread


def test_a_docker_test_outside_the_docker_paths_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tests" / "engine").mkdir(parents=True)
    (tmp_path / "tests" / "engine" / "test_d.py").write_text("def test_d(real_node):\n    pass\n")
    (tmp_path / "conftest.py").write_text("import pytest\n\n@pytest.fixture\ndef real_node():\n    return 'x'\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    res = _pytest(tmp_path, "--collect-only")
    assert res.returncode != 0
    assert "tests/engine/test_d.py::test_d uses Docker" in res.stdout + res.stderr, res.stdout + res.stderr
