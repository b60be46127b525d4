"""Which snapshot each rank of a new generation restores, and from where. Pure.

Shards are named by (generation, rank, step). After a failure the agents pool what
they hold (their workers' own slots and the replicas they keep for peers) and this
module picks the newest step that *every* new rank can restore, so the ranks resume
together:

  - a rank whose node took part in the previous generation restores its own shard
    (topology.previous_rank), from local memory or from a peer's replica; a rank on a
    replacement node restores the shard of the lost rank whose place it takes
    (topology.replaces);
  - a rank that is new, or whose own shard has no surviving copy, restores a DP
    peer's shard: previous-generation ranks of the same stage and TP rank hold the
    same parameters and optimizer state (its per-rank state, RNG and data position,
    is then the peer's: the script decides what to reset).

Which previous rank is a rank's own, and which are its DP peers, comes from the
topology's grid, unless a Lineage says otherwise: under a ReCycle plan a worker's
stage is its plan position's, which need not be its place in rtrain's shrunk grid
(core/layout/recycle.py: restore_lineage).

Replicas are placed on a ring: node n's shards go to nodes n+1 .. n+copies-1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ..layout.topology import Topology


@dataclass(frozen=True)
class ShardId:
    generation: int
    rank: int
    step: int


@dataclass(frozen=True)
class Lineage:
    """Whose state a rank of the new generation continues."""

    own: int | None  # the previous-generation rank whose shard is this rank's own
    peers: tuple[int, ...]  # previous-generation ranks holding the same parameters


@dataclass(frozen=True)
class RestoreSource:
    shard: ShardId
    holders: tuple[int, ...]  # node ranks (of the new generation) that hold a copy
    from_dp_peer: bool


def ring_successors(node_rank: int, num_nodes: int, copies: int) -> list[int]:
    """The nodes that keep replicas of node_rank's shards (copies includes the original)."""
    return [(node_rank + i) % num_nodes for i in range(1, min(copies, num_nodes))]


def plan_restore(
    topology: Topology,
    inventory: Mapping[int, Iterable[ShardId]],
    ceiling: int | None = None,
    unusable: Iterable[tuple[ShardId, int]] = (),
    lineage: Mapping[int, Lineage] | None = None,
) -> tuple[int, dict[int, RestoreSource]] | None:
    """(step, rank -> source) for the newest step every rank can restore, or None.

    inventory: node rank (new generation) -> the shards it holds. Only shards of the
    previous generation count: the agents relabel restored shards into each new one.
    ceiling: the newest step any node's own workers reached; a copy of a later step
    cannot be genuine and is ignored. unusable: (shard, holder) copies that failed
    verification or could not be fetched in an earlier attempt. lineage: rank -> whose
    state it continues, for the ranks where that is not the topology's grid.
    """
    previous = topology.generation - 1
    refused = set(unusable)
    holders: dict[tuple[int, int], set[int]] = {}
    for node, shards in inventory.items():
        for shard in shards:
            if (shard, node) in refused or (ceiling is not None and shard.step > ceiling):
                continue
            if shard.generation == previous:
                holders.setdefault((shard.rank, shard.step), set()).add(node)
    if not holders:
        return None
    # A step at which a copy of every previous rank's shard survives comes first: a
    # resharding load (torch.distributed.checkpoint after the mesh changed) reads
    # chunks of all of them, and a rank that died before its newest snapshot was
    # replicated has none of that step. It costs a plain restore at most a step.
    everyone = {rank for rank, _ in holders}
    newest_first = sorted({step for _, step in holders}, reverse=True)
    whole = [s for s in newest_first if all((r, s) in holders for r in everyone)]
    steps = whole + [s for s in newest_first if s not in whole]
    # A rank's own shard (RNG, data position and all) beats a DP peer's: the newest step
    # at which every rank has its own is preferred to a newer one that needs a peer's.
    lines = {
        c.rank: (lineage or {}).get(c.rank) or grid_lineage(topology, c.rank)
        for c in topology.coords
    }
    for peer_fallback in (False, True):
        for step in steps:
            plan: dict[int, RestoreSource] = {}
            for coord in topology.coords:
                source = _source(lines[coord.rank], step, holders, previous, peer_fallback)
                if source is None:
                    break
                plan[coord.rank] = source
            else:
                return step, plan
    return None


@dataclass(frozen=True)
class Reached:
    """What one node says its own workers reached before this restore."""

    newest: int | None = None  # the newest step any of them committed
    every_rank: bool = False  # every one of them had committed a snapshot
    was_member: bool = False  # the node ran in an earlier generation


class Written(NamedTuple):
    """Where a save's shards were written: the generation whose shards hold `step` as
    its workers wrote them (a restore relabels shards into each new generation, so the
    same save is also found under later generations' names, with other ranks)."""

    generation: int
    step: int


def written_in(
    generation: int, step: int, loaded: Iterable[Written], read_from: int | None = None
) -> Written:
    """Where the shards of `step` that generation `generation` restores were written.

    They are the generation's the restore read (read_from: older than the previous one
    when they were carried over generations that restored nothing; by default the
    previous one), unless that generation's workers were themselves restored to `step`
    (a second failure before a save every rank has): then its shards of `step` are
    relabelled copies, and the save is where the nodes that restored it said it was
    (`loaded`, as each node published it; a new node knows nothing and says nothing)."""
    read = generation - 1 if read_from is None else read_from
    earlier = [w.generation for w in loaded if w.step == step and w.generation < generation]
    return Written(min(earlier, default=read), step)


def job_ceiling(reached: Iterable[Reached]) -> int | None:
    steps = [r.newest for r in reached if r.newest is not None]
    return max(steps) if steps else None


def snapshots_existed(reached: Iterable[Reached]) -> bool:
    """Whether a step every rank could restore must have existed: every node that ran
    before had all its workers snapshot (and the snapshot policy keeps the ranks within
    a step of each other). Then no plan means copies were destroyed, and starting from
    scratch would silently throw the training away."""
    earlier = [r for r in reached if r.was_member]
    return bool(earlier) and all(r.every_rank for r in earlier)


def grid_lineage(topology: Topology, rank: int) -> Lineage:
    """Whose state `rank` continues by the topology's grid: its own previous rank (a
    replacement: the lost rank at its grid position), and the previous ranks of its
    stage and TP rank."""
    own = (topology.previous_rank or {}).get(rank)
    if own is None:  # a replacement takes over the lost rank at its grid position
        own = (topology.replaces or {}).get(rank)
    coord = topology.coords[rank]
    return Lineage(own, (topology.previous_holders or {}).get((coord.pp, coord.tp), ()))


def _source(
    line: Lineage,
    step: int,
    holders: Mapping[tuple[int, int], set[int]],
    previous: int,
    peer_fallback: bool,
) -> RestoreSource | None:
    own = line.own
    if own is not None and (own, step) in holders:
        return RestoreSource(
            ShardId(previous, own, step), tuple(sorted(holders[(own, step)])), False
        )
    if own is not None and not peer_fallback:
        return None
    for peer in line.peers:
        if (peer, step) in holders:
            shard = ShardId(previous, peer, step)
            return RestoreSource(shard, tuple(sorted(holders[(peer, step)])), True)
    return None
