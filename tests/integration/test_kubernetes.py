"""rtrain started the way each Kubernetes controller starts it, on pods emulated here
(tests/integration/pods.py: a network namespace a pod, its hostname and a kubelet-style
/etc/hosts, exactly the controller's environment). torchrun, same pods, is the oracle.

Issue 37 item 1: with Trainer v2's names (hostname tj-node-0-0, PET_MASTER_ADDR
tj-node-0-0.tj) no pod hosted the store and both exited 75 after the join timeout;
torchrun: exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import pods
from .helpers import PROBE, ROOT

RTRAIN = [sys.executable, "-m", "rtrain.cli.main", "launch"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
JOIN = "--rdzv-conf=join_timeout=30"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[pods.Cluster]:
    why = pods.unavailable()
    if why is not None:
        pytest.skip(f"pods cannot be emulated here: {why}")
    with pods.cluster(tmp_path) as made:
        yield made


def command(launcher: list[str], controller: pods.Controller, index: int) -> list[str]:
    """What the pod's container runs: the runtime's command, its flags from the env."""
    if controller.kind in ("pytorchjob", "volcano"):  # the user maps MASTER_*, RANK
        env = controller.env(index, 1)
        flags = [
            f"--nnodes={env['WORLD_SIZE']}",
            f"--node-rank={env['RANK']}",
            f"--master-addr={env['MASTER_ADDR']}",
            f"--master-port={env['MASTER_PORT']}",
        ]
        return [*launcher, *flags, "--nproc-per-node=1", PROBE]
    if controller.kind == "jobset":  # the JobSet's command maps its index itself
        flags = [
            f"--nnodes={controller.nodes}",
            f"--node-rank={index}",
            f"--master-addr={controller.pod_name(0)[0]}.{controller.job}",
            f"--master-port={controller.port}",
        ]
        return [*launcher, *flags, "--nproc-per-node=1", PROBE]
    return [*launcher, PROBE]  # PET_* carry everything


def start(
    cluster: pods.Cluster,
    controller: pods.Controller,
    launcher: list[str],
    out: Path,
    extra: dict[str, str] | None = None,
    late: int | None = None,
) -> list[pods.Pod]:
    """late: the pod whose DNS record is not out yet when the pods start."""
    started = []
    for index in range(controller.nodes):
        name, subdomain = controller.pod_name(index)
        pod = cluster.add_pod(name, subdomain, dns_late=index == late)
        started.append(pod)
    for index, pod in enumerate(started):
        env = pods.base_env(
            {**controller.env(index, 1), "PROBE_OUT": str(out), "PROBE_STEPS": "3", **(extra or {})}
        )
        if launcher is RTRAIN and controller.kind != "pytorchjob-elastic":
            env.setdefault("PET_RDZV_CONF", JOIN.split("=", 1)[1])
        cluster.run(pod, command(launcher, controller, index), env, cwd=ROOT)
    return started


def finished(out: Path, nodes: int) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(out.glob("gen*_rank*.json"))]
    return [r for r in found if r.get("steps") == 3 and len(found) >= nodes]


CONTROLLERS = [
    pods.Controller("trainer-v2", "tj", 2, 29400),
    pods.Controller("jobset", "js", 2, 29500),
    pods.Controller("pytorchjob", "pj", 2, 23456),
    pods.Controller("pytorchjob-elastic", "pe", 2, 29400, elastic=(2, 2)),
    pods.Controller("volcano", "vj", 2, 23456),
]


@pytest.mark.parametrize("controller", CONTROLLERS, ids=lambda c: c.kind)
def test_each_controller_starts_the_job(
    cluster: pods.Cluster, controller: pods.Controller, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    started = start(cluster, controller, RTRAIN, out)
    codes = [pod.wait(timeout=90) for pod in started]
    logs = "\n".join(pod.output()[-1500:] for pod in started)
    assert codes == [0, 0], logs
    assert len(finished(out, 2)) == 2, logs
    host_lines = [line for line in logs.splitlines() if "rendezvous store" in line and ": " in line]
    assert any("this node hosts" in line for line in host_lines), logs


@pytest.mark.parametrize("controller", CONTROLLERS, ids=lambda c: c.kind)
def test_torchrun_starts_the_same_pods(
    cluster: pods.Cluster, controller: pods.Controller, tmp_path: Path
) -> None:
    """The oracle: torchrun with the same names and environment."""
    out = tmp_path / "out"
    started = start(cluster, controller, TORCHRUN, out)
    codes = [pod.wait(timeout=90) for pod in started]
    assert codes == [0, 0], "\n".join(pod.output()[-1500:] for pod in started)


def test_the_store_hosts_late_dns_name_is_waited_for(cluster: pods.Cluster, tmp_path: Path) -> None:
    """A headless service's record comes out after the pod starts: the other pod waits
    for the name to resolve (join_timeout), it does not give up at once."""
    controller = CONTROLLERS[0]
    out = tmp_path / "out"
    first, second = start(cluster, controller, RTRAIN, out, late=0)
    end = time.monotonic() + 60
    while "rendezvous store" not in second.output() or "hosting" not in first.output():
        assert time.monotonic() < end, second.output()[-2000:]
        time.sleep(0.1)
    cluster.publish(first.name)
    codes = [pod.wait(timeout=90) for pod in (first, second)]
    assert codes == [0, 0], "\n".join(pod.output()[-1500:] for pod in (first, second))


def test_a_failed_launch_leaves_its_reason_in_the_termination_message(tmp_path: Path) -> None:
    """Issue 37 item 4: what a pod's status shows beside the exit code (the kubelet's
    terminationMessagePath; RTRAIN_TERMINATION_LOG points it here)."""
    message = tmp_path / "termination-log"
    env = pods.base_env({"RTRAIN_TERMINATION_LOG": str(message)})
    bad = [*RTRAIN, "--nnodes=two", PROBE]
    result = subprocess.run(bad, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 64, result.stderr
    assert message.read_text().startswith("rtrain: exit 64 (USAGE): --nnodes")
    ok = subprocess.run(
        [*RTRAIN, "--dry-run", PROBE], env=env, capture_output=True, timeout=60, cwd=ROOT
    )
    assert ok.returncode == 0 and message.read_text().startswith("rtrain: exit 64")
