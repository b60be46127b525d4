"""A newest snapshot handed from one worker to another: the bytes of a kept worker's
newest committed shard, and a new worker's adoption of them as its own snapshot, so
that its restore() returns the step the kept ones go on from (core/worker/repair/
through.py sends them over the process group when a warm replacement joins).

The bytes are read like any shard (core/snapshots/format.py's checked skeleton, no
pickle): what came over the network is refused if it is not one.
"""

from __future__ import annotations

from typing import Any

from ..snapshots.format import SnapshotError, check_shard, plan_shard, read_shard, write_shard
from .snapshots import _my_slots
from .stateful import state_of


def newest_shard() -> tuple[int, bytes] | None:
    """(step, bytes) of this worker's newest committed snapshot; None without one."""
    slots = _my_slots()
    newest = None if slots is None else slots.open_newest()
    if newest is None or newest.map is None:
        return None
    header, _ = check_shard(newest.map)
    return header.step, bytes(newest.map[: header.size])


def newest_step() -> int:
    """The step of this worker's newest committed snapshot; -1 without one."""
    found = newest_shard()
    return -1 if found is None else found[0]


def adopt_shard(buffer: Any) -> int:
    """Write the shard in `buffer` (another worker's, checked here) into this worker's
    slots as its own newest snapshot, whatever the job's interval; its step."""
    slots = _my_slots()
    if slots is None:
        raise SnapshotError("a handed-over snapshot can only be adopted under rtrain launch")
    state, step = read_shard(buffer)
    layout = plan_shard(state_of(state), slots.layout)
    target = slots.next_target(slots.open_newest())
    target.reserve(layout.size)
    assert target.map is not None
    write_shard(target.map, layout, step, 0, target.views, target.copier)
    slots.layout = layout
    slots.wake_agent()
    return step
