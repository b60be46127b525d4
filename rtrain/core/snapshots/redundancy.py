"""Which shard a replica can be sent against: the DP twin on the receiving node. Pure.

Ranks of one pipeline stage and tensor-parallel rank (the same pp and tp, another dp)
hold the same parameters and optimizer state when data parallelism replicates them
(DDP, the replicated dimension of HSDP). So when rank r's shard goes to a ring
successor (restore_plan.ring_successors) that runs such a rank, that node already
holds r's state but for what is unique to r: its RNG, sharded optimizer state, a data
position. The twin's shard of the same step is then the replica's base, and only the
chunks whose digests differ travel (agent/snapshots/peers/delta.py). Under FSDP the twin's
bytes differ and everything travels: the digests decide, the topology only proposes.
"""

from __future__ import annotations

from ..layout.topology import Topology


def dp_twin(topology: Topology, rank: int, node_rank: int) -> int | None:
    """The lowest rank on node `node_rank` with rank's pp and tp and another dp, or
    None (no such rank there, or rank is a spare)."""
    coord = next((c for c in topology.coords if c.rank == rank), None)
    if coord is None or coord.dp is None:
        return None
    twins = [
        c.rank
        for c in topology.coords
        if c.node_rank == node_rank
        and c.rank != rank
        and c.dp is not None
        and (c.pp, c.tp) == (coord.pp, coord.tp)
    ]
    return min(twins, default=None)
