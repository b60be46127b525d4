"""Other ranks' shards, asked of the agent by a worker (core/worker/peer_shards.py) and
served by it (agent/snapshots/restore/fetcher.py, prefetch.py): two JSON files in the
worker's snapshot folder, and the shard files the agent leaves beside them.

  rank<R>.fetch.json     {"id": hex, "step": S, "ranks": [r, ...]}   (the worker)
  rank<R>.fetched.json   {"id": hex, "files": {"r": name | null},    (the agent)
                          "errors": {"r": why}}
  fetched-r<R>-s<S>-<hex>.shard     a shard fetched for one request
  prefetched-r<R>-s<S>.shard        a shard fetched before it was asked for (.pending
                                    while on its way)

An answer is at most MAX_RESPONSE bytes; a file name outside these forms is refused.
"""

from __future__ import annotations

import posixpath
import re

MAX_RESPONSE = 1 << 20
FETCHED_NAME = re.compile(r"fetched-r[0-9]+-s[0-9]+-[0-9a-f]+\.shard")


def prefetched_name(rank: int, step: int) -> str:
    """The file the agent leaves rank `rank`'s shard of `step` in, fetched beforehand."""
    return f"prefetched-r{rank}-s{step}.shard"


def request_path(directory: str, rank: int) -> str:
    return posixpath.join(directory, f"rank{rank}.fetch.json")


def response_path(directory: str, rank: int) -> str:
    return posixpath.join(directory, f"rank{rank}.fetched.json")
