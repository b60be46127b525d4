"""A SIGTERM to one pod is that node leaving the job, not the job ending.

On Kubernetes a SIGTERM is an eviction, a node drain, a scale-down or a preemption of
one pod, and the kubelet SIGKILLs it a grace period later (30 s unless the pod says
otherwise). So under Kubernetes (KUBERNETES_SERVICE_HOST set), or anywhere with
--on-sigterm=leave, the agent leaves within LEAVE_BOUND_S:

1. it tells the others first, as a peer would that found its lease expired: declared
   lost by itself (JobRendezvous.declare_lost), a `lost_node` failure record saying why,
   and the next round opened, so they fence at once instead of waiting out the lease (its lease
   keeper stops with the agent); it is not charged a node failure (an eviction is not
   the node's fault), and a generation that lost a node does not use up a restart;
2. it stops its workers (their newest snapshot is already on peers: replication runs
   as they commit);
3. it exits 128 + 15.

The others go on: an elastic job at the smaller size, a fixed-size one waits for the
replacement pod and restores from peers' memory. A SIGTERM to every pod (the job
deleted) makes every node leave the same way, and the job ends. Under Slurm a SIGTERM
keeps its meaning there (save and requeue); --on-sigterm=end-job keeps the old one
(every node stops).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping

from ...core.clock import Clock
from ...core.config.launch_spec import LaunchSpec
from ...core.errors import exit_code_for_signal
from ...core.rendezvous.failures import FailureKind, FailureRecord
from ..generation import Joined
from ..observe.events import emit_failure
from ..rendezvous.job import JobRendezvous
from ..waiting import SYSTEM_CLOCK

logger = logging.getLogger(__name__)

KUBERNETES_VARIABLE = "KUBERNETES_SERVICE_HOST"
# Telling the others gets this long (a store call is bounded by read_timeout, which
# may be a minute: not here); the workers get WORKER_GRACE_S after their SIGTERM.
TELL_BOUND_S = 8.0
WORKER_GRACE_S = 5.0
LEAVE_BOUND_S = 20.0  # what README promises, within Kubernetes' default grace of 30 s
REASON = "a SIGTERM (on Kubernetes: an eviction, a node drain, a scale-down)"


def on_sigterm(spec: LaunchSpec, environ: Mapping[str, str]) -> str:
    """What a SIGTERM means here: "leave" or "end-job" (--on-sigterm, else by place)."""
    if spec.faults.on_sigterm:
        return spec.faults.on_sigterm
    return "leave" if environ.get(KUBERNETES_VARIABLE) else "end-job"


def leaves_on(signum: int, spec: LaunchSpec, environ: Mapping[str, str]) -> bool:
    """Whether this signal makes this node leave the job (Slurm's SIGTERM never does)."""
    return signum == signal.SIGTERM and spec.slurm is None and on_sigterm(spec, environ) == "leave"


def leave_job(
    rdzv: JobRendezvous,
    joined: Joined | None,
    addr: str,
    hosts_store: bool,
    stop_workers: Callable[[int, float], None],
    clock: Clock = SYSTEM_CLOCK,
) -> tuple[int, str]:
    """Leave the job for a SIGTERM: tell the others, stop the workers; (exit code, why).
    clock: how long leaving took (now), the lost_node record's time (wall)."""
    started = clock.now()
    logger.warning("received SIGTERM: this node leaves the job; the other nodes go on")
    told = _tell_the_others(rdzv, joined, addr, clock.wall())
    stop_workers(signal.SIGTERM, WORKER_GRACE_S)
    took = clock.now() - started
    message = f"this node left the job on {REASON}"
    if joined is not None:
        message += f" in generation {joined.membership.generation}"
    message += "; the other nodes go on" if told else "; the other nodes could not be told"
    if hosts_store:
        logger.warning(
            "this node hosted the rendezvous store (TCPStore): the others wait up to "
            "join_timeout for a store at the same name (its replacement pod); the etcd "
            "backend has no such host"
        )
    logger.info("left the job in %.1fs", took)
    return exit_code_for_signal(signal.SIGTERM), message


def _tell_the_others(rdzv: JobRendezvous, joined: Joined | None, addr: str, when: float) -> bool:
    """Declare this node lost in its generation at `when` (wall clock), with the reason,
    and open the next round, within TELL_BOUND_S (the store may be gone or slow: leaving
    must not wait on it; the bound is a real thread's join)."""
    if joined is None:
        return True  # not a member of any generation yet: nothing to tell
    generation, node_rank = joined.membership.generation, joined.node_rank
    record = FailureRecord(
        kind=FailureKind.LOST_NODE,
        generation=generation,
        node_rank=node_rank,
        host=addr,
        time=when,
        message=f"left the job on {REASON}",
    )
    done = threading.Event()

    def tell() -> None:
        try:
            if rdzv.declare_lost(generation, node_rank, node_rank, record):
                emit_failure(record, detect_s=0.0)
            rdzv.rounds.open_next_round(generation)
            done.set()
        except Exception as exc:  # the store may be gone; leaving must not fail
            logger.warning("could not tell the other nodes that this node leaves: %s", exc)

    teller = threading.Thread(target=tell, name="rtrain-leave", daemon=True)
    teller.start()
    teller.join(TELL_BOUND_S)
    return done.is_set()
