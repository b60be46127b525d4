"""The calls a training script makes to rtrain: heartbeat() and topology().

Both are cheap and safe to call without rtrain: under torchrun or a plain `python`
they do nothing (heartbeat) or describe a single pure-DP generation (topology).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

from ..contract.environment import HEARTBEAT_FILE, HEARTBEAT_FORMAT, HEARTBEAT_SIZE, TOPOLOGY_FILE
from ..layout.topology import Layout, NodeSlot, Topology, build_grid

__all__ = ["HEARTBEAT_FILE", "TOPOLOGY_FILE", "WorkerTopology", "heartbeat", "topology"]


class _Beat:
    def __init__(self) -> None:
        self.path: str | None = None
        self.map: mmap.mmap | None = None
        self.count = 0


_beat = _Beat()


def heartbeat(step: int | None = None) -> None:
    """Tell the agent this worker is making progress (one memory write, no system call).

    Until the first call only process liveness counts; after it, a worker that stops
    calling for longer than --hang-timeout is treated as hung.
    """
    path = os.environ.get(HEARTBEAT_FILE)
    if not path:
        return
    if _beat.path != path:  # first call, or a new generation's file after a fork
        with open(path, "r+b") as handle:
            _beat.map = mmap.mmap(handle.fileno(), HEARTBEAT_SIZE)
        _beat.path, _beat.count = path, 0
    assert _beat.map is not None
    _beat.count += 1
    struct.pack_into(HEARTBEAT_FORMAT, _beat.map, 0, _beat.count, -1 if step is None else step)


@dataclass(frozen=True)
class WorkerTopology:
    """This worker's place in the generation's DP x PP x TP grid."""

    generation: int
    rank: int
    world_size: int
    dp_rank: int | None  # None: a spare rank outside the grid
    pp_rank: int
    tp_rank: int
    dp_size: int
    pp_size: int
    tp_size: int
    tp_group: tuple[int, ...]
    pp_group: tuple[int, ...]
    dp_group: tuple[int, ...]
    lost_ranks: tuple[int, ...]
    # Previous-generation ranks that held this worker's stage and TP rank on nodes that
    # survived: identical parameters, the first place to fetch lost state from.
    previous_stage_holders: tuple[int, ...]
    previous_rank: int | None
    # On a node new to the job: the lost previous-generation rank whose place it takes.
    replaces_rank: int | None = None

    @property
    def is_spare(self) -> bool:
        return self.dp_rank is None


def topology() -> WorkerTopology:
    """The grid rtrain computed for this generation (written by the agent before the spawn)."""
    rank = int(os.environ.get("RANK", "0"))
    path = os.environ.get(TOPOLOGY_FILE)
    if path:
        with open(path) as handle:
            topo = Topology.decode(handle.read())
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        topo = build_grid(Layout(), generation, [NodeSlot("local", world)])
    return worker_view(topo, rank)


def worker_view(topo: Topology, rank: int) -> WorkerTopology:
    coord = topo.coords[rank]
    return WorkerTopology(
        generation=topo.generation,
        rank=rank,
        world_size=topo.world_size,
        dp_rank=coord.dp,
        pp_rank=coord.pp,
        tp_rank=coord.tp,
        dp_size=topo.dp_size,
        pp_size=topo.layout.pp,
        tp_size=topo.layout.tp,
        tp_group=topo.tp_group(rank) if coord.dp is not None else (rank,),
        pp_group=topo.pp_group(rank) if coord.dp is not None else (rank,),
        dp_group=topo.dp_group(rank) if coord.dp is not None else (),
        lost_ranks=topo.lost_ranks,
        previous_stage_holders=(topo.previous_holders or {}).get((coord.pp, coord.tp), ()),
        previous_rank=(topo.previous_rank or {}).get(rank),
        replaces_rank=(topo.replaces or {}).get(rank),
    )
