"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from tests.integration.cluster import STEPS, LocalCluster


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> list[float]:
    """The weights the job ends with when nothing fails (world size does not matter)."""
    tmp = tmp_path_factory.mktemp("reference")
    cluster = LocalCluster(tmp, 1, "1", ["--nproc-per-node=2"], PROBE_STEPS=STEPS)
    try:
        assert cluster.wait() == [0], cluster.log(0)
        return cluster.records()[(0, 0)]["weights"]
    finally:
        cluster.close()
