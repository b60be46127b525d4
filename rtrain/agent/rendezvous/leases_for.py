"""The leases of a job's store backend: etcd's own leases, or renewed keys on TCPStore."""

from __future__ import annotations

from ...core.clock import Clock
from ...core.config.launch_spec import FaultSpec
from ...core.rendezvous.protocol import StoreKeys
from ..store.backends import JobStore
from ..store.etcd.store import EtcdKeyValueStore
from ..waiting import SYSTEM_CLOCK
from .etcd_leases import EtcdLeases
from .lease import Leases, StoreLeases


def open_leases(
    job_store: JobStore, keys: StoreKeys, faults: FaultSpec, clock: Clock = SYSTEM_CLOCK
) -> Leases:
    """clock: the peers' watches' (and etcd's keep-alives' times)."""
    timeout, interval = faults.heartbeat_timeout, faults.heartbeat_interval
    if isinstance(job_store.kv, EtcdKeyValueStore):
        return EtcdLeases(job_store.kv, keys, timeout, interval, clock=clock)
    assert job_store.connect is not None
    return StoreLeases(job_store.kv, job_store.connect, keys, timeout, interval, clock)
