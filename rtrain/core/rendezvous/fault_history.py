"""The nodes' fault history across jobs: what failed where and when, kept small and
checked, and which nodes it puts last (standbys) for the next rounds. Pure: the agent
reads and writes the history (agent/health/fault_history.py) and acts on what these
return.

A history is one JSON object: a format version, its entries (host, kind, time, run)
and the SHA-256 of the entries' canonical JSON, so that a flipped byte or a torn write
is refused with one line, never trusted. It is bounded: at most MAX_ENTRIES entries,
none older than KEEP_S, at most MAX_BYTES encoded; the oldest go first.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence, Set
from dataclasses import asdict, dataclass

from ..config.slurm.hostlist import compress_hostlist
from .failures import FAILURE_KINDS

HISTORY_VERSION = 1
HISTORY_FILE = "rtrain-fault-history.json"  # in --checkpoint-dir, shared by the nodes
MAX_ENTRIES = 128
MAX_BYTES = 64 * 1024  # a bigger file is no history of ours: refused unread
KEEP_S = 30 * 86400.0  # an entry older than any sensible window is dropped
MAX_HOST = 255  # a DNS name's length
MAX_RUN = 64


class HistoryError(ValueError):
    """A fault history that is not one: the message says why, in one line."""


@dataclass(frozen=True)
class FaultEntry:
    """One fault charged to a node: its address (the one it joins with), the failure's
    kind (FailureKind's value), when (unix seconds) and in which run."""

    host: str
    kind: str
    time: float
    run: str = ""


@dataclass(frozen=True)
class HistoryPolicy:
    """A node charged `faults` faults within `window_s` starts last, as a standby
    (faults 0: never)."""

    faults: int
    window_s: float


def _canonical(entries: Sequence[FaultEntry]) -> bytes:
    body = [asdict(e) for e in entries]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode_history(entries: Sequence[FaultEntry]) -> bytes:
    digest = hashlib.sha256(_canonical(entries)).hexdigest()
    return json.dumps(
        {"v": HISTORY_VERSION, "entries": [asdict(e) for e in entries], "sha256": digest},
        sort_keys=True,
    ).encode()


def decode_history(data: bytes) -> tuple[FaultEntry, ...]:
    """The entries of an encoded history; HistoryError (one line) for anything else."""
    if len(data) > MAX_BYTES:
        raise HistoryError(f"{len(data)} bytes, over the {MAX_BYTES}-byte bound")
    try:
        whole = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise HistoryError("not a JSON document (a torn or foreign file)") from None
    if not isinstance(whole, dict) or whole.get("v") != HISTORY_VERSION:
        raise HistoryError(f"not a version-{HISTORY_VERSION} fault history")
    raw, digest = whole.get("entries"), whole.get("sha256")
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise HistoryError(f"'entries' is not a list of at most {MAX_ENTRIES}")
    entries = tuple(_entry(item, n) for n, item in enumerate(raw))
    if digest != hashlib.sha256(_canonical(entries)).hexdigest():
        raise HistoryError("its checksum does not match its entries (changed or corrupted)")
    return entries


def _entry(item: object, n: int) -> FaultEntry:
    if not isinstance(item, dict) or set(item) != {"host", "kind", "time", "run"}:
        raise HistoryError(f"entry {n}: not an object of host, kind, time, run")
    host, kind, when, run = item["host"], item["kind"], item["time"], item["run"]
    if not _printable(host, MAX_HOST) or not host:
        raise HistoryError(f"entry {n}: host is not a printable name of 1-{MAX_HOST} characters")
    if kind not in FAILURE_KINDS:
        raise HistoryError(f"entry {n}: unknown kind {str(kind)[:32]!r}")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        raise HistoryError(f"entry {n}: time is not a number")
    if when < 0 or not _printable(run, MAX_RUN):
        raise HistoryError(f"entry {n}: a negative time or a run id that is not printable")
    return FaultEntry(host, kind, float(when), run)


def _printable(value: object, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit and value.isprintable()


def with_fault(
    entries: Sequence[FaultEntry], entry: FaultEntry, now: float
) -> tuple[FaultEntry, ...]:
    """entries and the new one, within the bounds: none older than KEEP_S, the newest
    MAX_ENTRIES, and (long names) the oldest dropped until it encodes in MAX_BYTES."""
    kept = [e for e in entries if now - e.time <= KEEP_S][-(MAX_ENTRIES - 1) :]
    kept.append(entry)
    while len(kept) > 1 and len(encode_history(kept)) > MAX_BYTES:
        kept.pop(0)
    return tuple(kept)


def recent_faults(entries: Iterable[FaultEntry], window_s: float, now: float) -> dict[str, int]:
    """Each host's faults within the last window_s seconds."""
    return dict(Counter(e.host for e in entries if 0 <= now - e.time <= window_s))


def flagged_hosts(
    entries: Iterable[FaultEntry], policy: HistoryPolicy, now: float
) -> dict[str, int]:
    """The hosts the policy puts last, with their faults in the window."""
    if policy.faults <= 0:
        return {}
    counts = recent_faults(entries, policy.window_s, now)
    return {host: count for host, count in counts.items() if count >= policy.faults}


def slurm_exclude(hosts: Set[str], slurm_nodes: Sequence[str]) -> str:
    """The hostlist for `sbatch --exclude=` of the flagged hosts that are this job's
    Slurm node names ("" when none is): a node's address under Slurm is its name
    whenever the name resolves (core/config/slurm/env.py's apply_slurm)."""
    names = [node for node in slurm_nodes if node in hosts]
    return compress_hostlist(names) if names else ""


def demoted_members(ordered: Sequence[str], kept: Sequence[str], flagged: Set[str]) -> list[str]:
    """The flagged of `ordered` (a round's joiners, by address) that a close left out
    (not in `kept`): those whose history made them standbys, for its one log line."""
    chosen = set(kept)
    return [addr for addr in ordered if addr in flagged and addr not in chosen]
