"""The suite's pytest hooks: how tests are spread over pytest-xdist workers, and the run's report.

``tests/run.sh`` runs the suite with ``-n 3 --dist loadgroup``. Every worker is a session of its own:
its own control plane, stores and temporary directories, on free ports (nothing is shared but the
read-only binaries in ~/.cache/anarchon). What must not be split or doubled is grouped:

- a test file's tests run on one worker (its module-scoped fixtures, a UI's browser, a module's
  cluster, are built once);
- the tests that need Docker (the operator image, the real node's kubelet and containerd) run on
  one worker: one image build, one kubelet on the machine.

The groups are computed from the test ids by the scheduler below, not read from ``xdist_group``
marks: pytest-xdist 3.8 passes a mark to the controller by rewriting the test's id, which pytest
9.2 ignores (pytest-dev/pytest-xdist#1386), so marks silently group nothing.

Groups are handed out slowest folder first (:data:`SLOWEST_FIRST`), so that the last ones, which
decide when every worker is done, are short: a file of replicas tests takes minutes, one of the
kube client's tests seconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.report import lines

#: Fixtures that reach the Docker engine or start the real node ...
DOCKER_FIXTURES = frozenset({"operator_image", "image_on_real_node", "real_node"})
#: ... and where the tests that use them live (checked at collection).
DOCKER_TESTS = ("tests/image/", "tests/operator/test_real_node.py")
#: Test folders, the one whose files take longest in all first (a serial run's times); the rest after.
SLOWEST_FIRST = ("docker", "tests/operator/", "tests/engine/", "tests/cli/", "tests/chart/", "tests/ui/")
_REPORT_KEY = "anarchon_report"


def group_of(nodeid: str) -> str:
    """The worker-sharing group of a test: "docker", or its file."""
    path = nodeid.split("::", 1)[0]
    return "docker" if path.startswith(DOCKER_TESTS) else path


def _rank(nodeid: str) -> int:
    group = group_of(nodeid)
    return next((i for i, folder in enumerate(SLOWEST_FIRST) if group.startswith(folder)), len(SLOWEST_FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test that needs Docker outside :data:`DOCKER_TESTS` (it would run beside the others);
    on an xdist worker, order the tests slowest folder first (the order the scheduler hands them out)."""
    for item in items:
        if DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())) and group_of(item.nodeid) != "docker":
            raise pytest.UsageError(
                f"{item.nodeid} uses Docker ({', '.join(sorted(DOCKER_FIXTURES))}): "
                "put it under a path of DOCKER_TESTS in tests/harness/plugin.py"
            )
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _rank(item.nodeid))  # stable: a file keeps its own order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``: load scheduling by :func:`group_of` (a pytest-xdist hook)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the workers' order (slowest first), not the most tests first

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints its lines
        workeroutput[_REPORT_KEY] = list(lines)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controller's side of ``workeroutput`` (a pytest-xdist hook)."""
    lines.extend(getattr(node, "workeroutput", {}).get(_REPORT_KEY, []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in lines:
        terminalreporter.write_line(line)
