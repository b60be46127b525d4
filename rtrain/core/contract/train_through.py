"""What the workers of a train-through generation (core/worker/repair/through.py) say to
each other in the generation's store, and what a new worker's boot watches
(agent/repair/joiner_watch.py). Pure: the key names, and whether an environment
makes its worker a new one (a replacement that joins when warm)."""

from __future__ import annotations

from collections.abc import Mapping

from .environment import KEPT_RANKS, decode_ranks


def ready_key(generation: int, rank: int) -> str:
    """Set by a new worker whose start-up is done."""
    return f"rtrain/through/{generation}/ready/{rank}"


def regroup_key(generation: int) -> str:
    """Set by the kept ranks when they leave the interim for the whole group."""
    return f"rtrain/through/{generation}/regroup"


def finished_key(generation: int) -> str:
    """Set by the kept ranks when the function returned in the interim: the training
    ended before the new ranks were warm, and they have nothing to join."""
    return f"rtrain/through/{generation}/finished"


def interim_prefix(generation: int) -> str:
    """The kept ranks' interim group's keys."""
    return f"rtrain/through/{generation}/interim"


def joins_late(env: Mapping[str, str]) -> bool:
    """Whether a worker of this environment is a new one in a generation whose other
    ranks were kept (it may join when warm, if its script trains through)."""
    kept = decode_ranks(env.get(KEPT_RANKS)) or ()
    world = env.get("WORLD_SIZE", "1")
    rank = env.get("RANK", "")
    if not (kept and world.isdigit() and rank.isdigit()):
        return False
    return len(kept) < int(world) and int(rank) not in kept
