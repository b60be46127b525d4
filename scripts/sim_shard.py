"""One shard of bench_scale.py sim: simulated agents of one process, running the real
protocol code against a real store; bench_scale_sim.py runs a job's agents as several
shards and drives them.

Each simulated agent does what Agent does around its workers, through the same
classes: Rounds.join for generation 0, its lease held and its peers' watched
(StoreLeases or EtcdLeases), then the running generation's store checks at the
agent's cadence (monitor.STORE_CHECK_S: its peers' leases, and GenerationWatch: the
news, and the round, the abort record and the nodes waiting when it is set or on a
sweep), until one agent dies: it stops renewing its lease and leaves. The
survivors find it lost (FaultPolicy.check_leases), and join generation 1 expecting
each other (FaultPolicy.survivors). No workers are started: the figures are the
coordination's own. Store requests are counted at each agent's client.

How the agents share the process (sim_loop.py): the checks and the lease renewals are
tasks on one loop served by LOOP_WORKERS threads, not a thread per agent; the joins
(Rounds.join blocks) run on a thread per agent, parked between joins, JOIN_SLOTS of
them at a time. KeyNotices' blocking waits on TCPStore are the same requests on a
connection of each agent's own, their answers read by one thread (sim_notices.py).
What stays a thread per agent: over etcd, each agent's watch stream (JobWatch). The
loop's lateness (a check or renewal run later than due), how long its tasks took, and
the joins' wait for a slot are reported: the simulator's share.

    sim_shard.py BACKEND NODES ENDPOINT RUN_ID FIRST END [spares]

runs agents FIRST..END-1 of a job of NODES agents; with `spares`, hot spares beyond
NODES (max_nodes) instead: sent go once generation 0 runs, they join the next round
and wait there (Rounds.join), until the loss opens it and the first of them is let in.
It prints {"ready": ...} once they are connected and waiting, then answers each
command read from stdin with one JSON line: go (generation 0 starts; answered once
every agent here joined it), count (the requests and bytes so far, the lateness since
the last), kill (its last agent goes silent), finish (answered once every survivor
here joined generation 1; spares: once one was let in), exit.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from sim_counting import CountedEtcdClient, CountedTorchStore, Requests  # noqa: E402
from sim_loop import BATCH, Loop, RunSlots  # noqa: E402
from sim_notices import WaitMux  # noqa: E402

from rtrain.agent.faults import FaultPolicy  # noqa: E402
from rtrain.agent.generation import Joined  # noqa: E402
from rtrain.agent.monitor import STORE_CHECK_S  # noqa: E402
from rtrain.agent.rendezvous.etcd_leases import EtcdLeases  # noqa: E402
from rtrain.agent.rendezvous.generation_watch import GenerationWatch  # noqa: E402
from rtrain.agent.rendezvous.job import JobRendezvous  # noqa: E402
from rtrain.agent.rendezvous.lease import Leases, StoreLeases  # noqa: E402
from rtrain.agent.store.etcd.store import EtcdKeyValueStore  # noqa: E402
from rtrain.agent.store.opening import connect_store  # noqa: E402
from rtrain.agent.store.torch_store import TorchKeyValueStore  # noqa: E402
from rtrain.cli.launch_args import parse_launch_args  # noqa: E402
from rtrain.core.config.launch_spec import LaunchSpec, build_launch_spec  # noqa: E402
from rtrain.core.rendezvous.protocol import MemberInfo, Membership  # noqa: E402


def decode_memberships_once() -> None:
    """Every simulated agent reads the same closed membership; decoding it is each real
    agent's own CPU, spent in parallel on its own machine (13.5 ms at 2,048 members), but
    2,048 threads of one process would spend 28 s of one core on it. So, in a shard's
    process only (shard()), identical payloads are decoded once, by the first thread to
    read them while the others wait for it (all read at once: the closed key's waits
    end together): the store reads (bytes and requests) are unchanged."""
    decode = Membership.decode.__func__  # type: ignore[attr-defined]
    decoded: dict[tuple[bytes | str, int], Membership] = {}
    lock = threading.Lock()

    def decoded_once(cls: type, payload: bytes | str, generation: int) -> Membership:
        with lock:
            key = (payload, generation)
            if key not in decoded:
                if len(decoded) >= 16:
                    decoded.clear()
                decoded[key] = decode(cls, payload, generation)
            return decoded[key]

    Membership.decode = classmethod(decoded_once)  # type: ignore[method-assign, assignment]


CONNECTS_AT_ONCE = 16
TIMEOUT_S = 5.0  # heartbeat timeout
# Per backend: TCPStore's calls take well under a millisecond, etcd's (HTTP through the
# JSON gateway, on members that share the cores) milliseconds to tens of them, and the
# calls block: more threads serve the same agents, so renewals are not held up.
LOOP_WORKERS = {"c10d": 2, "etcd": 64}
JOIN_SLOTS = {"c10d": 8, "etcd": 64}


def _threads(setting: str, defaults: dict[str, int], backend: str) -> int:
    return int(os.environ.get(setting, defaults.get(backend, 2)))


def spec_for(backend: str, nodes: int, endpoint: str, run_id: str) -> LaunchSpec:
    flags = [
        f"--nnodes={nodes // 2}:{nodes}", f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
        "--rdzv-conf=join_timeout=600,read_timeout=120,last_call_timeout=30",
        "--heartbeat-interval=1", f"--heartbeat-timeout={TIMEOUT_S:g}", "train.py",
    ]  # fmt: skip
    return build_launch_spec(parse_launch_args(flags, {}))


class SimAgent:
    """One simulated agent: joins on a thread of its own (parked between joins, see
    sim_loop.RunSlots), runs its generation's checks and lease renewals on the loop."""

    def __init__(
        self, index: int, spec: LaunchSpec, requests: Requests, run: SimRun, spare: bool = False
    ) -> None:
        self.index = index
        self.spare = spare
        self.spec = spec
        self.run_ = run
        self.requests = requests
        self.member = MemberInfo(
            node_id=f"sim{index:05d}", addr=f"10.{index >> 16}.{(index >> 8) & 255}.{index & 255}",
            local_world_size=1,
        )  # fmt: skip
        self.joined_at: float | None = None
        self.declared_at: float | None = None
        self.committed_at: float | None = None
        self.next_size: int | None = None  # members of the generation it committed
        self.left_at: float | None = None  # left generation 0 (fenced or declaring)
        self.error: str | None = None
        self.leases: Leases | None = None
        self.ready = False
        self._opened: tuple[JobRendezvous, Leases, Callable[[], bool]] | None = None
        self._leave = threading.Event()
        self._running: Callable[[], float | None] | None = None

    def _open(self) -> tuple[JobRendezvous, Leases, Callable[[], bool]]:
        rdzv_spec, faults = self.spec.rdzv, self.spec.faults
        clock = self.run_.slots.clock
        if rdzv_spec.is_etcd:
            client = CountedEtcdClient(rdzv_spec.endpoints, deadline_s=rdzv_spec.join_timeout)
            client.requests = self.requests
            store = EtcdKeyValueStore(client, clock)
            rdzv = JobRendezvous.over(store, self.spec, clock)
            etcd_leases = EtcdLeases(
                store, rdzv.keys, faults.heartbeat_timeout, faults.heartbeat_interval, False
            )
            return rdzv, etcd_leases, etcd_leases.renew_once

        def connect_raw() -> Any:
            return connect_store(rdzv_spec.host, rdzv_spec.port, 60.0, rdzv_spec.read_timeout).store

        def connect() -> TorchKeyValueStore:
            # Called directly (no deadline thread): a thread per call would double the
            # threads of an already crowded process.
            counted = CountedTorchStore(connect_raw(), rdzv_spec.host, clock=clock)
            counted.requests = self.requests
            return counted

        # The waits' and the lease's own connections, opened now, before the clock
        # starts: opened later by many at once, connects held renewals up past the timeout.
        # The waits: KeyNotices' requests on a connection of the agent's own, their
        # answers read by the shard's one thread (sim_notices.py), not a thread each.
        store = connect()
        store._notices = self.run_.waits.notices(  # type: ignore[assignment]
            rdzv_spec.host, rdzv_spec.port, self.requests
        )
        rdzv = JobRendezvous.over(store, self.spec, clock)
        leases = StoreLeases(
            store,
            connect,
            rdzv.keys,
            faults.heartbeat_timeout,
            faults.heartbeat_interval,
            own_thread=False,
        )
        return rdzv, leases, leases.keeper.renew_once

    def prepare(self) -> None:
        """Open this agent's store connections, before the clock starts."""
        self._opened = self._open()

    def start(self) -> None:
        threading.Thread(target=self.run, name=f"sim-agent-{self.index}", daemon=True).start()

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported in the results
            self.error = f"{type(exc).__name__}: {exc}"[:300]

    def _run(self) -> None:
        assert self._opened is not None, "prepare() first"
        rdzv, leases, renew_once = self._opened
        policy = FaultPolicy(rdzv, self.spec, self.member.addr, lambda: None)
        loop, slots = self.run_.loop, self.run_.slots
        self.ready = True
        self.run_.opened.wait()
        if self.spare:  # waits in the next round until a loss opens it and lets it in
            self.joined_at = time.time()
            with slots:
                rdzv.rounds.join(self.member)
            self.committed_at = time.time()
            return
        with slots:
            membership = rdzv.rounds.join(self.member)
        self.joined_at = time.time()
        rank = membership.node_rank_of(self.member.node_id)
        assert rank is not None
        peers = leases.peers(0, rank, len(membership.members))
        leases.hold(0, rank)
        interval = self.spec.faults.heartbeat_interval
        loop.call_later(0.0, lambda: interval if renew_once() else None)
        room = len(membership.members) < self.spec.nodes.max_nodes
        watch = GenerationWatch(rdzv.rounds, rdzv.ends, 0, room)

        def check() -> float | None:
            """One pass of the running generation's store checks (Agent's cadence)."""
            try:
                if self.run_.victim is self:
                    leases.close()  # stops renewing: a silent loss
                    return None
                look = watch.due()
                if look and watch.fenced():
                    self._leave.set()
                    return None
                if policy.check_leases(membership, rank, peers):
                    self.declared_at = time.time()
                    self._leave.set()
                    return None
                if look:
                    watch.admits_waiting()
            except Exception as exc:  # reported in the results
                self.error = f"{type(exc).__name__}: {exc}"[:300]
                return None
            return STORE_CHECK_S

        loop.call_later(STORE_CHECK_S, check)
        self._leave.wait()
        if self.error is not None:
            return
        self.left_at = time.time()
        survivors = policy.survivors(Joined(membership, rank, peers))
        with slots:
            joined = rdzv.rounds.join(
                dataclasses.replace(self.member, prev_rank=rank), expected=survivors
            )
        self.committed_at = time.time()
        self.next_size = len(joined.members)
        # The lease is renewed on until the run ends (as an agent renews its next
        # generation's): a slower peer still checking generation 0 must not find it gone.
        self.leases = leases


class SimRun:
    def __init__(self, backend: str) -> None:
        self.opened = threading.Event()
        self.victim: SimAgent | None = None
        self.loop = Loop(
            _threads("BENCH_SCALE_LOOP_WORKERS", LOOP_WORKERS, backend),
            batch=1 if backend == "etcd" else BATCH,
        )
        self.waits = WaitMux()
        self.slots = RunSlots(_threads("BENCH_SCALE_JOIN_SLOTS", JOIN_SLOTS, backend))

    def lateness(self) -> dict[str, object]:
        return {
            "loop_late": self.loop.lateness.take(),
            "task_time": self.loop.durations.take(),
            "join_slot_wait": self.slots.waited.take(),
        }


def _wait_all(agents: list[SimAgent], done: Callable[[SimAgent], bool], timeout: float) -> None:
    """Until every agent is done or failed, or timeout seconds."""
    deadline = time.monotonic() + timeout
    while not all(done(a) or a.error for a in agents) and time.monotonic() < deadline:
        time.sleep(0.05)


def _reply(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


def shard(argv: list[str]) -> None:
    backend, nodes, endpoint, run_id, first, end = argv[:6]
    spare = argv[6:] == ["spares"]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 * 1024)
    decode_memberships_once()
    requests = Requests()
    spec = spec_for(backend, int(nodes), endpoint, run_id)
    run = SimRun(backend)
    agents = [SimAgent(i, spec, requests, run, spare) for i in range(int(first), int(end))]
    # A few connects at a time: thousands at once overflow the server's accept queue,
    # one at a time waits out each connect's reverse name lookup (no DNS here).
    with concurrent.futures.ThreadPoolExecutor(CONNECTS_AT_ONCE) as pool:
        list(pool.map(SimAgent.prepare, agents))
    for agent in agents:
        agent.start()
    _wait_all(agents, lambda a: a.ready, 300)  # every agent waiting before the clock
    _reply({"ready": len(agents), "threads": threading.active_count()})
    survivors = agents
    for line in sys.stdin:
        command = line.strip()
        if command == "go":
            run.opened.set()
            _wait_all(agents, lambda a: a.joined_at is not None, 300)
            joined = [a.joined_at for a in agents]
            _reply({"joined_at": None if None in joined else max(joined), **_errors(agents)})  # type: ignore[type-var]
        elif command == "count":
            _reply({**requests.snapshot(), **run.lateness(), **_watch_starts(agents)})
        elif command == "kill":
            run.victim = agents[-1]
            survivors = agents[:-1]
            _reply({"killed": agents[-1].index})
        elif command == "finish":
            if spare:  # the first spare let in; the others wait on for the next round
                _wait_all(agents[:1], lambda _: any(a.committed_at for a in agents), 120)
                survivors = [a for a in agents if a.committed_at is not None] or agents
            _wait_all(survivors, lambda a: a.committed_at is not None, 120)
            declared = [a.declared_at for a in survivors if a.declared_at is not None]
            committed = [a.committed_at for a in survivors]
            left = [a.left_at for a in survivors if a.left_at is not None]
            _reply({
                "declared_at": min(declared, default=None),
                "committed_at": None if None in committed else max(committed),  # type: ignore[type-var]
                "left_at": max(left, default=None),
                # survivors that found the lease stale before the fence reached them:
                # one or more of the victim's watchers, not only the one whose
                # declaration the store recorded
                "declared_by": len(declared),
                "next_sizes": sorted({a.next_size for a in survivors if a.next_size}),
                **requests.snapshot(),
                **run.lateness(),
                **_watch_starts(agents),
                **_errors(survivors),
            })  # fmt: skip
        elif command == "exit":
            break
    run.loop.stop()
    for agent in agents:
        if agent.leases is not None:
            agent.leases.close()
    # Hundreds of daemon threads, some inside TCPStore's C++ calls: interpreter
    # teardown under them aborts, so this process ends without it (all is flushed).
    os._exit(0)


def _watch_starts(agents: list[SimAgent]) -> dict[str, object]:
    """Over etcd: the agents' watch streams started so far (each one HTTP stream through
    the gateway and a read), and why they started again."""
    starts, reasons = 0, collections.Counter[str]()
    for agent in agents:
        store = agent._opened[0].store if agent._opened is not None else None
        if isinstance(store, EtcdKeyValueStore) and store._job_watch is not None:
            starts += store._job_watch.starts
            reasons.update(store._job_watch.restarts)
    return {"watch_starts": starts, "watch_restarts": dict(reasons)} if starts else {}


def _errors(agents: list[SimAgent]) -> dict[str, object]:
    errors = [a.error for a in agents if a.error]
    return {"error": errors[0]} if errors else {}


if __name__ == "__main__":
    shard(sys.argv[1:])
