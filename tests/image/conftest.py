"""The operator image, built once per session from the repo's Dockerfile (see imagelib.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.report import report
from tests.image.imagelib import Build, build_image, engine_or_fail, image_size_mb, standin_base

TAG = "anarchon:test"


@pytest.fixture(scope="session")
def operator_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The image's tag. Built twice: the first build shows the time as the layer cache stands (cold on
    a fresh machine), the second the time of a rebuild with nothing changed (every step cached)."""
    engine_or_fail()
    base = standin_base()
    secrets = tmp_path_factory.mktemp("pip-secrets")
    first: Build = build_image(TAG, base, secrets)
    again: Build = build_image(TAG, base, secrets)
    assert again.cached_steps >= 5, f"the rebuild did not use the layer cache:\n{again.log[-3000:]}"
    state = f"{first.cached_steps} steps from the layer cache" if first.cached_steps else "cold"
    report(
        f"operator image {TAG} on stand-in base {base}: {image_size_mb(TAG):.0f} MB; "
        f"build {first.seconds:.0f}s ({state}), "
        f"rebuild {again.seconds:.1f}s (cached)"
    )
    return TAG


@pytest.fixture(scope="session")
def image_on_real_node(real_node: str, operator_image: str, control_plane: Any) -> str:
    """The operator image, imported into the real node's containerd (no registry to pull it from)."""
    control_plane.real_node.import_images([operator_image])
    return operator_image
