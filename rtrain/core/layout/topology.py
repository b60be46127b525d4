"""The DP x PP x TP grid of one generation, and how it is recomputed after failures.

Rank order: TP is fastest, then PP, then DP (rank = (dp * pp + pp_rank) * tp + tp_rank).
One DP replica is a block of pp*tp consecutive ranks, so a TP group (tp consecutive
ranks) never straddles a node as long as every node's worker count is a multiple of
tp, and losing a node removes whole replicas' worth of ranks: DP shrinks, the number
of pipeline stages never changes.

When the world size is not a multiple of pp*tp, the ranks past the last whole replica
are spares: they run, but hold no place in the grid (a training script gives them no
work, or uses them to take over a failed stage).

Pure: everything here works on plain values and is unit tested in milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ExitCode, RtrainError

TOPOLOGY_VERSION = 1


class LayoutError(RtrainError):
    """The nodes cannot hold the declared layout (no worker left for a stage, split TP group)."""

    exit_code = ExitCode.LAYOUT


@dataclass(frozen=True)
class Layout:
    """The parallel layout a job declares: --tp and --pp; DP follows from the world size."""

    tp: int = 1
    pp: int = 1

    @property
    def replica_size(self) -> int:
        return self.tp * self.pp

    def check_node(self, local_world_size: int) -> None:
        if local_world_size % self.tp:
            raise LayoutError(
                f"--tp={self.tp} does not divide a node's {local_world_size} workers: "
                "a tensor-parallel group must stay on one node"
            )


@dataclass(frozen=True)
class NodeSlot:
    """One node of a generation, in node-rank order: who it is and how many workers it runs."""

    node_id: str
    local_world_size: int


@dataclass(frozen=True)
class Coord:
    """A rank's place in the grid; dp is None for a spare rank."""

    rank: int
    node_rank: int
    dp: int | None
    pp: int
    tp: int


@dataclass(frozen=True)
class Topology:
    generation: int
    layout: Layout
    dp_size: int
    nodes: tuple[NodeSlot, ...]
    coords: tuple[Coord, ...]
    # Ranks of the previous generation whose node is gone.
    lost_ranks: tuple[int, ...] = ()
    # (pp, tp) -> previous-generation ranks of that stage on nodes that survived; their
    # parameters are the ones this generation's workers of that stage must hold.
    previous_holders: dict[tuple[int, int], tuple[int, ...]] | None = None
    # rank -> the same worker slot's rank in the previous generation (same node, same
    # local rank), when that node took part in it.
    previous_rank: dict[int, int] | None = None
    # rank (on a node new to the job) -> the lost previous-generation rank that held
    # the same grid position: the place this worker takes over, e.g. on a replacement.
    replaces: dict[int, int] | None = None

    @property
    def world_size(self) -> int:
        return len(self.coords)

    @property
    def spare_ranks(self) -> tuple[int, ...]:
        return tuple(c.rank for c in self.coords if c.dp is None)

    def tp_group(self, rank: int) -> tuple[int, ...]:
        c = self.coords[rank]
        return tuple(x.rank for x in self.coords if x.dp == c.dp and x.pp == c.pp)

    def pp_group(self, rank: int) -> tuple[int, ...]:
        c = self.coords[rank]
        return tuple(x.rank for x in self.coords if x.dp == c.dp and x.tp == c.tp)

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """The rank's DP peers (same stage, same TP rank): they hold identical parameters."""
        c = self.coords[rank]
        return tuple(
            x.rank for x in self.coords if x.dp is not None and x.pp == c.pp and x.tp == c.tp
        )

    def summary(self) -> str:
        spares = f", {len(self.spare_ranks)} spare" if self.spare_ranks else ""
        lost = f", lost ranks {list(self.lost_ranks)}" if self.lost_ranks else ""
        return (
            f"DP={self.dp_size} x PP={self.layout.pp} x TP={self.layout.tp} "
            f"over {len(self.nodes)} nodes{spares}{lost}"
        )

    def encode(self) -> str:
        return json.dumps(
            {
                "v": TOPOLOGY_VERSION,
                "generation": self.generation,
                "tp": self.layout.tp,
                "pp": self.layout.pp,
                "dp": self.dp_size,
                "nodes": [[n.node_id, n.local_world_size] for n in self.nodes],
                "lost_ranks": list(self.lost_ranks),
                "previous_holders": [
                    [pp, tp, list(ranks)]
                    for (pp, tp), ranks in sorted((self.previous_holders or {}).items())
                ],
                "previous_rank": sorted((self.previous_rank or {}).items()),
                "replaces": sorted((self.replaces or {}).items()),
            }
        )

    @classmethod
    def decode(cls, payload: str) -> Topology:
        """Rebuild from encode(); the grid itself is recomputed, so it cannot disagree."""
        try:
            data: dict[str, Any] = json.loads(payload)
            if data["v"] != TOPOLOGY_VERSION:
                raise ValueError("unknown version")
            layout = Layout(tp=int(data["tp"]), pp=int(data["pp"]))
            nodes = [NodeSlot(str(n), int(size)) for n, size in data["nodes"]]
            grid = build_grid(layout, int(data["generation"]), nodes)
            holders = {(int(p), int(t)): tuple(map(int, r)) for p, t, r in data["previous_holders"]}
            previous = {int(k): int(v) for k, v in data["previous_rank"]}
            replaces = {int(k): int(v) for k, v in data.get("replaces", [])}
            lost = tuple(int(r) for r in data["lost_ranks"])
        except (ValueError, KeyError, TypeError) as exc:
            raise LayoutError(f"unreadable topology record ({exc})") from None
        return replace(
            grid,
            lost_ranks=lost,
            previous_holders=holders,
            previous_rank=previous,
            replaces=replaces,
        )


def build_grid(layout: Layout, generation: int, nodes: Sequence[NodeSlot]) -> Topology:
    """The grid for these nodes alone, with no history."""
    for node in nodes:
        layout.check_node(node.local_world_size)
    world = sum(n.local_world_size for n in nodes)
    dp_size = world // layout.replica_size
    if dp_size == 0:
        raise LayoutError(
            f"{world} workers cannot hold one replica of PP={layout.pp} x TP={layout.tp} "
            f"({layout.replica_size} workers): a pipeline stage would have no worker"
        )
    coords = []
    for rank in range(world):
        replica, within = divmod(rank, layout.replica_size)
        pp_rank, tp_rank = divmod(within, layout.tp)
        coords.append(
            Coord(
                rank,
                _node_of(nodes, rank),
                replica if replica < dp_size else None,
                pp_rank,
                tp_rank,
            )
        )
    return Topology(generation, layout, dp_size, tuple(nodes), tuple(coords))


def recompute_topology(
    layout: Layout, generation: int, nodes: Sequence[NodeSlot], previous: Topology | None
) -> Topology:
    """The grid for this generation's nodes, and what it inherits from the previous one."""
    grid = build_grid(layout, generation, nodes)
    if previous is None:
        return grid
    alive = {n.node_id for n in nodes}
    lost = tuple(
        c.rank for c in previous.coords if previous.nodes[c.node_rank].node_id not in alive
    )
    holders: dict[tuple[int, int], tuple[int, ...]] = {}
    for c in previous.coords:
        if c.dp is not None and previous.nodes[c.node_rank].node_id in alive:
            holders.setdefault((c.pp, c.tp), ())
            holders[(c.pp, c.tp)] += (c.rank,)
    # Whose state each new rank continues: the old rank at its own grid coordinate where
    # the old grid had it (a node-rank shift must not hand stage 2's state to stage 0,
    # nor one DP rank's RNG and data position to another); else, on a node that ran
    # before, the old rank it ran there if that held the same stage. previous_rank
    # names an old rank of the same node (its state is local), replaces another's.
    prev_offsets = _offsets(previous.nodes)
    offsets = _offsets(nodes)
    on_node: dict[int, int] = {}
    for node in nodes:
        if node.node_id not in prev_offsets:
            continue
        prev_offset, prev_size = prev_offsets[node.node_id]
        for local in range(min(node.local_world_size, prev_size)):
            on_node[offsets[node.node_id][0] + local] = prev_offset + local
    old_at = {(c.dp, c.pp, c.tp): c.rank for c in previous.coords if c.dp is not None}
    old_coord = {c.rank: c for c in previous.coords}
    previous_rank: dict[int, int] = {}
    replaces: dict[int, int] = {}
    for c in grid.coords:
        kept = on_node.get(c.rank)
        if c.dp is None:  # a spare holds no state; it keeps its old rank's name
            if kept is not None:
                previous_rank[c.rank] = kept
            continue
        exact = old_at.get((c.dp, c.pp, c.tp))
        if exact is not None:
            if kept == exact:
                previous_rank[c.rank] = exact
            else:
                replaces[c.rank] = exact
        elif kept is not None and (old_coord[kept].pp, old_coord[kept].tp) == (c.pp, c.tp):
            previous_rank[c.rank] = kept
    return replace(
        grid,
        lost_ranks=lost,
        previous_holders=holders,
        previous_rank=previous_rank,
        replaces=replaces,
    )


def _offsets(nodes: Sequence[NodeSlot]) -> dict[str, tuple[int, int]]:
    result, offset = {}, 0
    for node in nodes:
        result[node.node_id] = (offset, node.local_world_size)
        offset += node.local_world_size
    return result


def _node_of(nodes: Sequence[NodeSlot], rank: int) -> int:
    offset = 0
    for node_rank, node in enumerate(nodes):
        offset += node.local_world_size
        if rank < offset:
            return node_rank
    raise ValueError(f"rank {rank} is past the last node")
