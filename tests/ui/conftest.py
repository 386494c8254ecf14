"""``anarchon ui`` in a real browser: Debian's chromium, headless, driven by Selenium through Debian's
chromedriver (never a driver or browser fetched by Selenium Manager), against the real control
plane with an operator replica running the jobs.

Everything is per module, shared by its tests: one namespace, one replica, one ``anarchon ui``
process per user, one browser session. Screenshots go under the pytest temporary directory
(their paths printed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cluster import Cluster, Replicas
from tests.harness.controlplane import fresh_namespace
from tests.ui.uilib import chromium

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def ui_namespace(crds: Any) -> Iterator[str]:
    """A namespace for the whole module (the ``namespace`` fixture is per test)."""
    with fresh_namespace(crds, "ui") as name:
        yield name


@pytest.fixture(scope="module")
def ui_cluster(control_plane: Any, ui_namespace: str) -> Cluster:
    return Cluster(control_plane, ui_namespace)


@pytest.fixture(scope="module")
def ui_replicas(control_plane: Any, ui_namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    logs = tmp_path_factory.mktemp("replicas")
    replicas = Replicas(control_plane, ui_namespace, f"sqlite://{logs / 'store.db'}", logs)
    yield replicas
    replicas.stop_all()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module."""
    try:
        driver = chromium()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go (kept by pytest with its temporary directories)."""
    return tmp_path_factory.mktemp("ui-screenshots")
