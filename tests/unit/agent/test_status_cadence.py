"""The agent's status record (agent/observe/observer.py) at the job's size: every 5 s up
to 64 nodes, less often past it, so that 2,000 nodes write no more status records a
second for the job than 64 nodes did (issue 36: 400 a second at 2,000 nodes)."""

from __future__ import annotations

from pathlib import Path

from rtrain.agent.observe.observer import Observer
from rtrain.core.config.component_specs import observe_part
from rtrain.core.rendezvous.place import Place
from rtrain.core.rendezvous.protocol import MemberInfo, Membership, StoreKeys

from .fakes import FakeClock, FaultyStore, launch_spec, memory_store


def _status_writes(nodes: int, seconds: float, tmp_path: Path) -> int:
    clock = FakeClock()
    spec = launch_spec("--nnodes=1:20000", "--rdzv-backend=c10d", "--rdzv-endpoint=x:1")
    observer = Observer(observe_part(spec), str(tmp_path), "10.0.0.1", 1, clock.clock)
    store = FaultyStore(memory_store())
    members = [
        MemberInfo(f"id{n}", f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}", 1) for n in range(nodes)
    ]
    place = Place(Membership(0, members), 0)
    keys = StoreKeys(spec.rdzv.run_id)
    steps = int(seconds / 0.25)
    for _ in range(steps):  # the monitor's pass, every 0.25 s
        observer.publish_status(store, keys, place, [], None, None)
        clock.sleep(0.25)
    observer.close()
    return store.calls["set"]


def test_a_big_job_writes_its_status_records_at_a_small_jobs_total_rate(tmp_path: Path) -> None:
    small = _status_writes(64, 300.0, tmp_path / "small")
    big = _status_writes(2000, 300.0, tmp_path / "big")
    assert small == 60  # every 5 s
    assert big == 2  # every 156 s: 2,000 of them write 12.8 a second, as 64 did
    assert big * 2000 <= small * 64 * 1.1
