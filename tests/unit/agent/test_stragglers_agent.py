"""Slow ranks, the agents' part (agent/observe/stragglers.py), on a fake clock and an
in-process store: two nodes' agents read pace files written as a worker writes them
(the worker's own writer, core/worker/pace.py, for one of them), node 0 judges and
plans, node 1 names its slow rank in a `straggler` event and clears it; the status
record carries it."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from rtrain.agent.health.gpu_clocks import gpu_clocks
from rtrain.agent.observe.events import EVENTS, emit
from rtrain.agent.observe.observer import Observer
from rtrain.agent.observe.stragglers import PUBLISH_S, PaceWatch
from rtrain.core.config.component_specs import observe_part
from rtrain.core.contract.pace import PACE_FORMAT, PLAN_LATEST, Plan, pace_path, plan_key
from rtrain.core.observe.events import Event
from rtrain.core.observe.status import NodeStatus
from rtrain.core.rendezvous.place import Place
from rtrain.core.rendezvous.protocol import MemberInfo, Membership, StoreKeys
from rtrain.core.worker import pace
from tests.unit.agent.fakes import FakeClock, launch_spec, memory_store


class Worker:
    """A rank's pace file, grown as a worker's steps grow it."""

    def __init__(self, folder: Path, local: int) -> None:
        self.path = pace_path(str(folder / f"rank{local}.beat"))
        self.seq, self.steps, self.compute = 0, 0, 0.0

    def step(self, steps: int, per_logical: float) -> None:
        self.seq += 2
        self.steps += steps
        self.compute += steps * 4 * per_logical
        data = struct.pack(
            PACE_FORMAT, self.seq, self.steps, self.steps * 4, self.compute, 0.0, 0.0
        )
        Path(self.path).write_bytes(data)


def _watch(
    store: Any, clock: FakeClock, node: int, folder: Path, worker_store: Any, mode: str = "balance"
) -> PaceWatch:
    keys = StoreKeys("job")
    return PaceWatch(
        store, keys, 0, node, 2, str(folder), lambda: [(0, node)], worker_store, clock.clock, mode
    )


@pytest.fixture
def seen() -> Any:
    events: list[Event] = []
    EVENTS.listen(events.append)
    yield events
    EVENTS.close()


def test_node_1s_slow_rank_is_found_planned_said_and_cleared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seen: list[Event]
) -> None:
    store, clock, workers_store = memory_store(), FakeClock(), dist.HashStore()
    folders = [tmp_path / "n0", tmp_path / "n1"]
    for folder in folders:
        folder.mkdir()
    watches = [
        _watch(store, clock, n, folders[n], workers_store if n == 0 else None) for n in (0, 1)
    ]
    ranks = [Worker(folders[n], 0) for n in (0, 1)]

    def run(seconds: int, slow: float) -> None:
        for _ in range(seconds):
            ranks[0].step(10, 0.01)
            ranks[1].step(10, slow)
            for watch in watches:
                watch.check()
            clock.sleep(PUBLISH_S)

    run(6, 0.025)
    (found,) = [e for e in seen if e.name == "straggler"]
    assert found["rank"] == 1 and found["slower"] == pytest.approx(2.5)
    assert found["gpu"] is None and found["logical"] == 4.0
    assert Plan.decode(workers_store.get(plan_key(1))) == Plan(1, {1: 0.4})
    assert workers_store.get(PLAN_LATEST) == b"1"
    run(6, 0.01)
    (cleared,) = [e for e in seen if e.name == "straggler_cleared"]
    assert cleared["rank"] == 1 and cleared["slow_s"] > 0
    newest = int(workers_store.get(PLAN_LATEST))
    assert Plan.decode(workers_store.get(plan_key(newest))) == Plan(newest, {})  # even again


def test_a_script_that_does_not_measure_costs_no_store_traffic(tmp_path: Path) -> None:
    class Counting:
        calls = 0

        def __getattr__(self, name: str) -> Any:
            Counting.calls += 1
            raise AssertionError(f"store.{name}")

    watch = _watch(Counting(), FakeClock(), 0, tmp_path, None)
    watch.check()
    assert Counting.calls == 0


def test_the_worker_writes_its_pace_where_its_agent_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTRAIN_HEARTBEAT_FILE", str(tmp_path / "rank0.beat"))
    for _ in range(3):
        pace.begin(2)
        pace.computed()
        pace.waited(0.001)
    figures = _watch(None, FakeClock(), 0, tmp_path, None).local_figures()
    assert (figures[0].steps, figures[0].logical) == (3, 6)
    assert figures[0].wait_s == pytest.approx(0.003) and figures[0].compute_s >= 0


def test_the_status_record_carries_the_stragglers() -> None:
    record = NodeStatus(1.0, "running", (0, 1), (5, 5), stragglers=((1, 2.5, 0.5),))
    assert NodeStatus.decode(record.encode()).stragglers == ((1, 2.5, 0.5),)
    assert "stragglers" not in NodeStatus(1.0, "running", (0,), (5,)).encode()


def test_the_agents_status_record_names_its_straggler_until_it_is_cleared(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    spec = launch_spec("--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=x:1")
    observer = Observer(observe_part(spec), str(tmp_path), "10.0.0.1", 1, clock.clock)
    store, keys = memory_store(), StoreKeys(spec.rdzv.run_id)
    place = Place(Membership(0, [MemberInfo("id0", "10.0.0.1", 2)]), 0)

    def record() -> NodeStatus:
        clock.sleep(10)  # past the status period
        observer.publish_status(store, keys, place, [], None, None)
        return NodeStatus.decode(store.get(keys.status(0, 0)) or b"")

    try:
        emit("straggler", rank=1, slower=2.5, since=5.0, gpu=None)
        assert record().stragglers == ((1, 2.5, 5.0),)
        emit("straggler_cleared", rank=1, slow_s=3.0)
        assert record().stragglers == ()
    finally:
        observer.close()


def test_a_straggler_s_gpu_reading_is_nvml_s_where_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = tmp_path / "nvml.json"
    readings = {"temperature": 88, "clock_reasons": 0x40}  # hot: thermal slowdown
    scenario.write_text(json.dumps({"driver": True, "gpus": [{"readings": readings}]}))
    monkeypatch.setenv("RTRAIN_FAKE_NVML", str(scenario))
    found = gpu_clocks(0)
    assert found is not None and (found["temperature_c"], found["throttle_reasons"]) == (88, 0x40)
    assert found["sm_clock_mhz"] is None  # a reading NVML does not give: null
    assert gpu_clocks(5) is None  # no such GPU
    scenario.write_text(json.dumps({"driver": False, "gpus": []}))
    assert gpu_clocks(0) is None
