"""JobInterval (agent/snapshots/replication/interval.py): the nodes' agents agree on one snapshot
interval through the real store (torch's HashStore under the typed seam), and hand the
same schedule to every node's workers, at a store cost of one key per change."""

from __future__ import annotations

from pathlib import Path

from rtrain.agent.snapshots.replication.interval import JobInterval
from rtrain.core.rendezvous.keys import StoreKeys
from rtrain.core.snapshots.interval import INTERVAL_FILE, Change, Schedule

from .fakes import memory_store


class CountingStore:
    """The real store, with its writes counted."""

    def __init__(self) -> None:
        self.inner = memory_store()
        self.writes = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def set(self, key, value):
        self.writes += 1
        return self.inner.set(key, value)

    def compare_set(self, key, expected, desired):
        self.writes += 1
        return self.inner.compare_set(key, expected, desired)


def _schedule(folder: Path) -> Schedule | None:
    return Schedule.decode((folder / INTERVAL_FILE).read_bytes())


def test_the_nodes_agree_on_the_largest_interval_any_of_them_wants(tmp_path: Path) -> None:
    store = CountingStore()
    keys = StoreKeys("job")
    folders = [tmp_path / "n0", tmp_path / "n1", tmp_path / "n2"]
    nodes = []
    for rank, folder in enumerate(folders):
        folder.mkdir()
        node = JobInterval(store, keys, active=True)
        node.follow(3, rank, 3, str(folder), [2 * rank, 2 * rank + 1])
        nodes.append(node)
    # Every node's workers start with the job's first schedule: every step.
    assert {_schedule(f) for f in folders} == {Schedule()}
    for step in range(0, 40, 2):  # gap 2: step indices 0..19
        for rank, node in enumerate(nodes):
            wants = {0: 1, 1: 4, 2: 16}[rank] if step >= 20 else 1
            node.note(2 * rank, step, wants, 2, 0.01)
            node.note(2 * rank + 1, step, 1, 2, 0.01)
    for node in nodes:
        node.poll()
    for node in nodes:
        node.poll()  # a node that appended before another's raise reads it now
    schedules = {_schedule(f) for f in folders}
    assert len(schedules) == 1
    (schedule,) = schedules
    assert schedule.last.interval == 16 and schedule.last.start % 16 == 0
    assert schedule.last.start > 19  # past every index the workers had reached
    assert all(node.schedule == schedule for node in nodes)
    writes = store.writes
    # Nothing changed: polling again writes nothing (the cost is per change, not per step).
    for step in range(40, 80, 2):
        for rank, node in enumerate(nodes):
            node.note(2 * rank, step, {0: 1, 1: 4, 2: 16}[rank], 2, 0.01)
        for node in nodes:
            node.poll()
    assert store.writes == writes
    # One key per node per change of its want, and the job's appends: 3 nodes published
    # 1, then 2 raised theirs (4, 16), and at most one append per raise.
    assert writes <= 3 + 2 + 2


def test_a_node_that_wants_no_more_than_the_job_changes_nothing(tmp_path: Path) -> None:
    store = memory_store()
    keys = StoreKeys("job")
    node = JobInterval(store, keys, active=True)
    node.follow(0, 0, 1, str(tmp_path), [0])
    node.note(0, 0, 1, 1, 0.0)
    node.poll()
    assert store.get(keys.snapshot_schedule(0)) is None  # the default: nothing written
    node.note(0, 10, 8, 1, 0.5)
    node.poll()
    held = Schedule.decode(store.get(keys.snapshot_schedule(0)))
    assert held is not None and held.last.interval == 8
    assert _schedule(tmp_path) == held and held.changes[0] == Change(0, 1)


def test_under_the_wait_policy_nothing_is_read_or_written(tmp_path: Path) -> None:
    store = CountingStore()
    node = JobInterval(store, StoreKeys("job"), active=False)
    node.follow(0, 0, 1, str(tmp_path), [0])
    node.note(0, 0, 8, 1, 0.5)
    node.poll()
    assert store.writes == 0 and not (tmp_path / INTERVAL_FILE).exists()


def test_a_change_starts_past_the_workers_heartbeats_not_the_replicators_late_notes(
    tmp_path: Path,
) -> None:
    """The replicator notes a step a replication late; the workers' heartbeats say
    where they are. A change must start past the heartbeats, or it starts at a step
    the workers already passed (measured 1.7-7.9 s late under load)."""
    store = memory_store()
    keys = StoreKeys("job")
    node = JobInterval(store, keys, active=True)
    node.follow(0, 0, 1, str(tmp_path), [0, 1])
    for step in range(0, 20, 2):  # gap 2: the replicator has seen indices up to 9
        node.note(0, step, 1, 2, 0.01)
    node.poll([300, 302])  # the workers' heartbeats: step 302, index 151
    node.note(0, 20, 8, 2, 0.9)  # the late note of index 10 asks for a larger k
    node.poll([304, 306])
    held = Schedule.decode(store.get(keys.snapshot_schedule(0)))
    assert held is not None and held.last.interval == 8
    assert held.last.start > 306 // 2  # past the furthest heartbeat's index
    assert _schedule(tmp_path) == held


def test_heartbeats_before_the_first_snapshot_change_nothing(tmp_path: Path) -> None:
    """Before a worker snapshots, the step gap is unknown: heartbeats are not counted."""
    store = memory_store()
    keys = StoreKeys("job")
    node = JobInterval(store, keys, active=True)
    node.follow(0, 0, 1, str(tmp_path), [0])
    node.poll([1000])
    node.note(0, 0, 8, 1, 0.5)
    node.poll()
    held = Schedule.decode(store.get(keys.snapshot_schedule(0)))
    assert held is not None and held.last.interval == 8 and held.last.start < 1000
