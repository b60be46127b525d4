"""The agent's one watch stream over a real 3-member etcd (agent/store/etcd/job_watch.py):
many keys on one stream, and the three ways a watch can miss a change: an event lost,
the stream cut mid-generation, a revision compacted away. Each falls back to a read
(the stream's next start reads every key at one revision), so no generation's news,
round or closed membership is ever missed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from rtrain.agent.store.etcd.client import EtcdClient
from rtrain.agent.store.etcd.job_watch import JobWatch, Target
from rtrain.agent.store.etcd.store import EtcdKeyValueStore

BOUND_S = 10.0


def _store(etcd: Any) -> EtcdKeyValueStore:
    endpoints = [("127.0.0.1", m.client_port) for m in etcd.members]
    return EtcdKeyValueStore(EtcdClient(endpoints))


def _until(check: Callable[[], bool], watch: JobWatch) -> bool:
    deadline = time.monotonic() + BOUND_S
    while not check():
        if time.monotonic() > deadline:
            return False
        watch.wait_change(0.1)
    return True


def _keys(n: int) -> list[str]:
    job = f"/rtrain/jw-{uuid.uuid4().hex[:8]}"
    return [f"{job}/round", f"{job}/abort"] + [f"{job}/r{g}/news" for g in range(n - 2)]


def test_many_keys_ride_one_stream(etcd: Any) -> None:
    store = _store(etcd)
    keys = _keys(8)
    notices = [store.notice(key) for key in keys]
    assert not any(check() for check in notices)
    for key in keys:
        store.set(key, "set")
    watch = store.job_watch
    assert _until(lambda: all(check() for check in notices), watch)
    assert watch.starts >= 1
    store.close()


class _Dropping(JobWatch):
    """Loses the first event of one key, as a stream that dropped it would."""

    def __init__(self, *args: Any, drop: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drop = drop
        self.dropped = False

    def _apply(self, target: Target, events: object) -> None:
        if not self.dropped and target.key == self.drop and isinstance(events, list) and events:
            self.dropped = True
            return
        super()._apply(target, events)


def test_an_event_the_stream_lost_is_read_at_its_next_start(etcd: Any) -> None:
    store = _store(etcd)
    news = _keys(3)[2]
    watch = _Dropping(store.client, idle_s=0.5, drop=news)
    assert watch.value(news) is None
    assert _until(lambda: watch.starts >= 1, watch)
    time.sleep(0.3)  # the stream is up (created): the write below comes as an event
    store.set(news, "round")
    assert _until(lambda: watch.value(news) == b"round", watch)
    assert watch.dropped  # the event was lost, and a read brought the change anyway
    watch.close()
    store.close()


def test_a_stream_cut_mid_generation_misses_no_change(etcd: Any) -> None:
    store = _store(etcd)
    keys = _keys(6)
    watch = JobWatch(store.client)
    for key in keys:
        assert watch.value(key) is None
    assert _until(lambda: watch.starts >= 1, watch)
    starts = watch.starts
    for round_ in range(1, 6):
        for key in keys:
            store.set(key, str(round_))
        watch._kick()  # the stream is cut between two generations' writes
    assert _until(lambda: all(watch.value(k) == b"5" for k in keys), watch)
    # The cut stream started again (and read every key first); which reason its restart
    # was counted under, if any (a cut can read as the stream's clean end, or as a
    # pending target's addition), is a race.
    assert watch.starts > starts
    watch.close()
    store.close()


class _Behind(JobWatch):
    """Starts its first stream from a revision etcd has compacted away."""

    stale_from: int = 0

    def _snapshot(self) -> tuple[list[Target], int]:
        targets, at = super()._snapshot()
        if self.stale_from:
            at, self.stale_from = self.stale_from, 0
        return targets, at


def test_a_compacted_revision_is_read_again(etcd: Any) -> None:
    store = _store(etcd)
    round_key = _keys(2)[0]
    first = store.client.put(round_key, "0")
    old = int(first["header"]["revision"])
    for generation in range(1, 4):
        now = store.client.put(round_key, str(generation))
    store.client.call("kv/compaction", {"revision": str(now["header"]["revision"])})
    watch = _Behind(store.client)
    watch.stale_from = old  # its stream starts at old + 1: compacted
    assert watch.value(round_key) == b"3"
    # etcd refuses the compacted start; the next start reads again and streams from there
    assert _until(lambda: watch.restarts["compacted"] == 1 and watch.starts >= 2, watch)
    store.set(round_key, "4")
    assert _until(lambda: watch.value(round_key) == b"4", watch)
    watch.close()
    store.close()
