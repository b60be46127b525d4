"""The train-through watch (agent/repair/through_watch.py) over real control folders
and the note it makes (core/observe/through.py), as status records carry it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtrain.agent.repair.control import WorkerControl
from rtrain.agent.repair.through_watch import ThroughWatch
from rtrain.agent.workers.records import Worker
from rtrain.core.contract.repair_files import INTERIM, RUNNING, WHOLE, WorkerState, encode_state
from rtrain.core.observe.events import Event
from rtrain.core.observe.status import NodeStatus
from rtrain.core.observe.through import ThroughError, ThroughNote, merged
from rtrain.core.rendezvous.protocol import ProtocolError


def _say(control: WorkerControl, pid: int, group: str, generation: int = 4) -> None:
    Path(control.folder, "state.json").write_bytes(
        encode_state(WorkerState(RUNNING, generation, pid, group))
    )


def test_a_node_says_when_its_kept_ranks_train_reduced_and_when_full_again(
    tmp_path: Path, events: list[Event]
) -> None:
    now = [100.0]
    control = lambda local: WorkerControl(str(tmp_path), local)  # noqa: E731
    for local in (0, 1):
        control(local).clear()
    workers = [Worker(0, 0, "", "", pid=10), Worker(1, 1, "", "", pid=11)]
    watch = ThroughWatch(control, 4, (0, 2, 3), 4, lambda: now[0])
    assert watch.see(workers) is None  # nothing said yet
    _say(control(0), 10, INTERIM)
    _say(control(1), 99, WHOLE)  # another process's word (a stale file): not counted
    note = watch.see(workers)
    assert note is not None and not note.full and note.shares[2] == (1, 2)
    assert note.describe(112.4) == (
        "training at 3 of 4 ranks, rank 1's share on rank 2, rank 1 joining: warming up 12 s"
    )
    now[0] = 130.0
    _say(control(1), 11, WHOLE)  # the new rank 1 joined
    _say(control(0), 10, WHOLE)
    assert watch.see(workers).full  # type: ignore[union-attr]
    names = [(e.name, e.fields) for e in events]
    assert names == [
        (
            "train_through",
            {"kept": [0, 2, 3], "joining": [1], "shares": {"0": [0], "2": [1, 2], "3": [3]}},
        ),
        ("full_size", {"joined": [1], "reduced_s": 30.0}),
    ]


def test_no_watch_where_nothing_was_kept_or_all_was(tmp_path: Path) -> None:
    control = lambda local: WorkerControl(str(tmp_path), local)  # noqa: E731
    assert not ThroughWatch(control, 1, (), 4, lambda: 0.0).active
    assert not ThroughWatch(control, 1, (0, 1), 2, lambda: 0.0).active


def test_a_status_record_carries_the_note_and_refuses_a_forged_one() -> None:
    note = ThroughNote((0, 2), (1,), {0: (0,), 2: (1, 2)}, 5.0)
    record = NodeStatus(6.0, "running", (0,), (3,), through=note)
    assert NodeStatus.decode(record.encode()).through == note
    forged = record.encode().replace('"since":5.0', '"since":"soon"')
    with pytest.raises(ProtocolError, match="through"):
        NodeStatus.decode(forged)
    assert merged([note, ThroughNote((3,), (1,), {3: (3,)}, 4.0, True)]) == ThroughNote(
        (0, 2, 3), (1,), {0: (0,), 2: (1, 2), 3: (3,)}, 4.0, False
    )


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["kept", "joining", "shares", "since", "full", "x"]),
        st.one_of(
            st.integers(-3, 5),
            st.floats(allow_nan=True),
            st.lists(st.integers(-1, 4), max_size=4),
            st.dictionaries(st.text(max_size=3), st.lists(st.integers(-1, 4), max_size=3)),
            st.booleans(),
            st.none(),
        ),
    )
)
def test_a_note_from_the_store_is_a_note_or_refused(data: dict[str, Any]) -> None:
    try:
        note = ThroughNote.from_fields(data)
    except ThroughError:
        return
    assert ThroughNote.from_fields(note.as_json()) == note
    assert note.describe(note.since + 1.0)
