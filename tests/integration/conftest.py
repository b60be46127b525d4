"""Fixtures shared by the integration tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import outliving_the_test
from tests.integration.cluster import SNAPSHOTTING, STEPS, LocalCluster
from tests.integration.shard_peer_helpers import guarded  # noqa: F401 - a fixture for the shard tests
from tests.integration.shared_runs import once_per_run


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> list[float]:
    """The weights the job ends with when nothing fails (world size does not matter);
    one run for the whole test run (tests/integration/shared_runs.py)."""

    def produce(tmp: Path) -> list[float]:
        cluster = LocalCluster(tmp, 1, "1", ["--nproc-per-node=2"], PROBE_STEPS=STEPS)
        try:
            assert cluster.wait() == [0], cluster.log(0)
            return cluster.records()[(0, 0)]["weights"]
        finally:
            cluster.close()

    return once_per_run(tmp_path_factory, "reference", produce)


@dataclass(frozen=True)
class SnapshotReference:
    final: str  # parameters and Adam state at the end of a 2 x 2 run with no fault
    steps: dict[int, str]  # ... and after each step


SNAPSHOT_FLAGS = ["--nproc-per-node=2", "--heartbeat-interval=0.5", "--heartbeat-timeout=2"]
SNAPSHOT_STEPS = "30"


@pytest.fixture(scope="session")
def snapshot_reference(tmp_path_factory) -> SnapshotReference:
    """train_snapshot.py on 2 nodes of 2 workers with no fault: what every test that
    injects faults into that job must end with (one run for the whole test run)."""

    def produce(tmp: Path) -> dict:
        cluster = LocalCluster(
            tmp,
            2,
            "2",
            SNAPSHOT_FLAGS,
            script=SNAPSHOTTING,
            PROBE_STEPS=SNAPSHOT_STEPS,
            PROBE_STEP_DIGESTS="1",
        )
        try:
            assert cluster.wait() == [0, 0], cluster.log(0)
        finally:
            cluster.close()
        paths = list(cluster.out.glob("final_rank*.json"))
        finals = {json.loads(p.read_text())["digest"] for p in paths}
        assert len(finals) == 1 and len(paths) == 4
        steps = {
            p.stem.removeprefix("digest_step"): p.read_text()
            for p in cluster.out.glob("digest_step*.txt")
        }
        return {"final": finals.pop(), "steps": steps}

    shared = once_per_run(tmp_path_factory, "snapshot_reference", produce)
    steps = {int(step): digest for step, digest in shared["steps"].items()}
    return SnapshotReference(shared["final"], steps)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """A real 3-member etcd cluster on 127.0.0.1 (scripts/etcd_cluster.py), fresh for
    each test module. Missing etcd fails in CI (which installs it) and skips elsewhere."""
    import importlib.util
    import os
    import shutil
    import sys

    from tests.integration.helpers import ROOT

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
    base, held = _held_base_port()
    cluster = module.EtcdCluster(str(tmp_path_factory.mktemp("etcd")), 3, base)
    restart = cluster.restart

    def restart_for_the_module(name: str) -> None:  # a member the module's cluster keeps
        with outliving_the_test():
            restart(name)

    cluster.restart = restart_for_the_module
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        for port in held:
            port.close()


def _held_base_port() -> tuple[int, list]:
    """A base port and base..base+2, base+100..base+102 held (HeldPort) for the module:
    a member killed and restarted by a test must find its port again. Below the
    kernel's ephemeral range (32768 and up on Linux), where one was taken meanwhile by
    some client's outgoing connection (etcd: "bind: address already in use", in CI);
    held, no other module's cluster can take it either."""
    import random

    from tests.integration.helpers import HeldPort

    for _ in range(50):
        base = random.randrange(20000, 32000)
        held: list[HeldPort] = []
        try:
            for port in (*range(base, base + 3), *range(base + 100, base + 103)):
                held.append(HeldPort(port))
        except OSError:
            for port in held:
                port.close()
            continue
        return base, held
    raise RuntimeError("no free ports for an etcd cluster")
