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


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """A real 3-member etcd cluster on 127.0.0.1 (scripts/etcd_cluster.py), fresh for
    each test module. Missing etcd fails in CI (which installs it) and skips elsewhere."""
    import importlib.util
    import os
    import shutil
    import sys

    from tests.integration.helpers import ROOT, free_port

    if shutil.which("etcd") is None:
        if os.environ.get("CI"):
            pytest.fail("no etcd binary: .ci/run installs Debian's etcd-server")
        pytest.skip("no etcd binary (apt-get install etcd-server)")
    spec = importlib.util.spec_from_file_location(
        "etcd_cluster", ROOT / "scripts" / "etcd_cluster.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    base = _free_base_port(free_port)
    cluster = module.EtcdCluster(str(tmp_path_factory.mktemp("etcd")), 3, base)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _free_base_port(free_port) -> int:
    """A base port with base..base+2 and base+100..base+102 free."""
    import socket

    for _ in range(50):
        base = 20000 + free_port() % 30000
        try:
            for port in (*range(base, base + 3), *range(base + 100, base + 103)):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free ports for an etcd cluster")
