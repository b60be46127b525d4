"""Opening the job's rendezvous store: the backend --rdzv-backend names.

c10d and static: torch's TCPStore, hosted by the node that owns the endpoint (and, if
that node dies, gone with it). etcd and etcd-v2: an etcd v3 cluster that no agent
hosts, so that no node is special; both names mean the v3 API (etcd 3.6 dropped v2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.clock import Clock
from ...core.config.launch_spec import RdzvSpec
from ...core.errors import RendezvousError, first_line
from ..observe.first_contact import announce_store
from ..waiting import SYSTEM_CLOCK
from .etcd.client import EtcdClient
from .etcd.members import Members, first_member
from .etcd.store import EtcdKeyValueStore
from .etcd.wire import EtcdTls, NotEtcd
from .kv import KeyValueStore
from .opening import connect_store, open_rendezvous_store
from .torch_store import TorchKeyValueStore

logger = logging.getLogger(__name__)

# One etcd request waits this long for a member before trying the next.
ETCD_ATTEMPT_S = 5.0


@dataclass
class JobStore:
    kv: KeyValueStore
    # This node's agent serves the store: it must outlive the others' last reads.
    is_host: bool
    # A connection of its own, for the lease thread (TCPStore); None for etcd, whose
    # leases keep their own client (agent/rendezvous/etcd_leases.py).
    connect: Callable[[], KeyValueStore] | None


def open_job_store(
    rdzv: RdzvSpec,
    local_addr: str | None,
    interrupt: Callable[[], None],
    node_rank: int | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> JobStore:
    """interrupt: called while an etcd call waits for a member, or while the TCPStore
    has not answered yet (it raises on a signal). node_rank: --node-rank (the static
    rendezvous hosts the store on node rank 0). clock: the store's waits (the agent's)."""
    if rdzv.is_etcd:
        etcd = open_etcd(rdzv, interrupt, local_addr, clock)
        announce_store(rdzv, rdzv.port, hosted=False)
        return JobStore(etcd, is_host=False, connect=None)
    opened = open_rendezvous_store(
        rdzv.host,
        rdzv.port,
        rdzv.is_host,
        local_addr,
        rdzv.join_timeout,
        rdzv.read_timeout,
        interrupt,
        backend=rdzv.backend,
        node_rank=node_rank,
        clock=clock,
    )
    endpoint = f"{rdzv.host}:{opened.port}"
    announce_store(rdzv, opened.port, opened.is_host)

    def connect_raw() -> Any:
        # A second connection to a store that answered the first: read_timeout, the bound
        # of any call to it, not a window of its own (a loaded host answers late).
        timeout = rdzv.read_timeout
        return connect_store(rdzv.host, opened.port, timeout, timeout, clock=clock).store

    def connect() -> KeyValueStore:
        return TorchKeyValueStore(connect_raw(), endpoint, rdzv.read_timeout, clock)

    # notice() waits on a connection of its own (agent/store/torch_notices.py).
    kv = TorchKeyValueStore(opened.store, endpoint, rdzv.read_timeout, clock, connect_raw)
    return JobStore(kv, opened.is_host, connect)


def open_etcd(
    rdzv: RdzvSpec,
    interrupt: Callable[[], None] | None = None,
    local_addr: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> EtcdKeyValueStore:
    """A client of the etcd cluster; checks that it answers as etcd before returning.
    Calls wait for quorum up to join_timeout: the job survives an etcd outage that ends
    within it, its workers training meanwhile. The client starts on a member picked by
    this node's address, so that the job's nodes spread over the members."""
    tls = None
    if rdzv.protocol == "https":
        try:
            tls = EtcdTls(rdzv.cacert, rdzv.cert, rdzv.key)
            tls.context()
        except (OSError, ValueError) as exc:
            raise RendezvousError(
                f"--rdzv-conf cacert/cert/key: cannot load them: {first_line(exc)}"
            ) from None
    client = EtcdClient(
        rdzv.endpoints,
        tls,
        attempt_s=min(ETCD_ATTEMPT_S, rdzv.read_timeout),
        deadline_s=rdzv.join_timeout,
        interrupt=_once(interrupt),
        clock=clock,
        members=Members(len(rdzv.endpoints), first_member(local_addr, len(rdzv.endpoints))),
    )
    status = client.call("maintenance/status", {})
    if not isinstance(status.get("header"), dict) or "version" not in status:
        raise NotEtcd(f"--rdzv-endpoint={client.endpoint} answers, but not as etcd does")
    logger.info("rendezvous over etcd %s at %s", status["version"], client.endpoint)
    return EtcdKeyValueStore(client, clock)


def _once(interrupt: Callable[[], None] | None) -> Callable[[], None] | None:
    """interrupt, until it raises once: the shutdown that follows still needs the store."""
    if interrupt is None:
        return None
    fired = False

    def check() -> None:
        nonlocal fired
        if not fired:
            try:
                interrupt()
            except BaseException:
                fired = True
                raise

    return check
