"""What a SIGTERM means (agent/kube/eviction.py, issue 37 item 2): leave under
Kubernetes or with --on-sigterm=leave, end the job elsewhere or with end-job; Slurm's
SIGTERM keeps its save-and-requeue. The leave itself runs on emulated pods
(tests/integration/test_kubernetes_faults.py)."""

from __future__ import annotations

import dataclasses
import signal

from rtrain.agent.kube.eviction import leaves_on, on_sigterm

from .fakes import launch_spec

KUBE = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def test_kubernetes_leaves_elsewhere_the_job_ends() -> None:
    spec = launch_spec()
    assert on_sigterm(spec, KUBE) == "leave" and on_sigterm(spec, {}) == "end-job"
    assert leaves_on(signal.SIGTERM, spec, KUBE)
    assert not leaves_on(signal.SIGTERM, spec, {})
    assert not leaves_on(signal.SIGINT, spec, KUBE)  # only a SIGTERM is an eviction


def test_the_flag_chooses_anywhere() -> None:
    assert leaves_on(signal.SIGTERM, launch_spec("--on-sigterm=leave"), {})
    assert not leaves_on(signal.SIGTERM, launch_spec("--on-sigterm=end-job"), KUBE)


def test_slurm_keeps_save_and_requeue() -> None:
    spec = launch_spec("--on-sigterm=leave")
    under_slurm = dataclasses.replace(spec, slurm=object())  # type: ignore[arg-type]
    assert not leaves_on(signal.SIGTERM, under_slurm, KUBE)
