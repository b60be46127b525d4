"""examples/kubernetes/jobset-cpu.yaml runs a real job that survives a pod loss: its
pods' own command and environment (the manifest's, in the environment JobSet gives a
pod, the job secret as its Secret would give it), its script (train_resilient.py, where
the Dockerfile puts it), on pods emulated here (tests/integration/pods.py), each with a
memory-backed /dev/shm of its own. A pod is killed while the job trains and a
replacement started at its name, as the JobSet's Job does: the job goes on from the
step it had kept, the replacement's workers restored from their peer's memory, and
ends with the checksum of a run that lost nothing."""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_kubernetes_examples import (
    EXAMPLES,
    container_env,
    documents,
    expand,
    launch_argv,
    pod_templates,
    rtrain_container,
)

from . import pods
from .helpers import ROOT, probe_env, run

pytestmark = pytest.mark.integration

STEPS = 1500  # about 10 s of training here; the manifest's 20000 would take minutes
SHM_BYTES = 2**30  # the manifest's emptyDir sizeLimit


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[pods.Cluster]:
    why = pods.unavailable()
    if why is not None:
        pytest.skip(f"pods cannot be emulated here: {why}")
    with pods.cluster(tmp_path) as made:
        yield made


def image_path(path: str) -> str:
    """Where the image's file comes from in this checkout (the Dockerfile's COPY)."""
    for line in (EXAMPLES / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and words[-1] == path:
            return str(ROOT / words[1])
    raise AssertionError(f"the image has no {path}")


def pod_command(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The manifest's command as this checkout runs it: rtrain from here, the script
    from where the image copies it, fewer steps."""
    argv = expand(launch_argv(container), env)
    script = next(a for a in argv if a.endswith(".py"))
    argv = [image_path(a) if a == script else a for a in argv]
    argv = [f"--steps={STEPS}" if a.startswith("--steps=") else a for a in argv]
    return [sys.executable, "-m", "rtrain.cli.main", *argv[1:]]


def checksum(output: str) -> str:
    found = re.findall(r"parameter checksum (-?\d+\.\d+)", output)
    assert len(found) == 1, output[-3000:]
    return found[0]


def test_the_cpu_jobset_survives_a_pod_lost_and_replaced(
    cluster: pods.Cluster, tmp_path: Path
) -> None:
    docs = documents("jobset-cpu.yaml")
    jobset = docs["JobSet"]
    (node,) = jobset["spec"]["replicatedJobs"]
    (template,) = pod_templates(node)
    container = rtrain_container(template)
    nodes = node["template"]["spec"]["parallelism"]
    nproc = next(a for a in launch_argv(container) if a.startswith("--nproc-per-node="))
    controller = pods.Controller("jobset", jobset["metadata"]["name"], nodes, 29500)

    def start(index: int) -> pods.Pod:
        name, subdomain = controller.pod_name(index)
        pod = cluster.add_pod(name, subdomain)
        own = container_env(container, name)
        own["RTRAIN_SECRET"] = "the-secret-of-this-job"  # as the Secret gives it
        env = pods.base_env({**controller.env(index, 0), **own})
        env["PET_RDZV_CONF"] = "join_timeout=90"
        command = pod_command(container, env)
        return cluster.run(pod, command, env, shm_bytes=SHM_BYTES, cwd=tmp_path)

    first, second = start(0), start(1)
    deadline = time.monotonic() + 120
    while "step   300" not in first.output():
        assert time.monotonic() < deadline, first.output()[-3000:]
        assert first.proc is not None and first.proc.poll() is None, first.output()[-3000:]
        time.sleep(0.1)
    cluster.remove(second, signal.SIGKILL)  # the pod is lost: its node, its memory
    replacement = start(1)  # the Job's new pod, the same name, a new address
    assert first.wait(timeout=240) == 0, first.output()[-3000:]
    assert replacement.wait(timeout=30) == 0, replacement.output()[-3000:]
    restored = re.findall(r"restored step (\d+); going on", first.output())
    assert restored and int(restored[-1]) >= 300, first.output()[-3000:]
    assert re.search(r"0 shards from local memory, \d+ from peers", replacement.output())

    # the same job, nothing lost: its workers on one node
    workers = nodes * int(nproc.split("=", 1)[1])
    script = [image_path("/workspace/train_resilient.py"), "--backend=gloo", f"--steps={STEPS}"]
    launch = [sys.executable, "-m", "rtrain.cli.main", "launch", "--standalone"]
    whole = run([*launch, f"--nproc-per-node={workers}", *script], probe_env(tmp_path), 240)
    assert whole.returncode == 0, whole.stderr[-3000:]
    # To float rounding: DDP made anew after the restore groups its first step's
    # gradients in its initial buckets, not the ones it rebuilt after its first step,
    # and the all-reduce then adds in another order (3e-6 here); a restore of another
    # step or of the wrong state is far off.
    assert float(checksum(first.output())) == pytest.approx(float(checksum(whole.stdout)), rel=1e-4)
