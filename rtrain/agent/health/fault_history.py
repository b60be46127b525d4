"""FaultHistory: the agent's side of the nodes' fault history (the rules, pure:
core/rendezvous/fault_history.py).

The job's store holds the history while the job runs (one key, appended by
compare_set, so concurrent charges are never lost); with --checkpoint-dir it is seeded
from, and written back to, <dir>/rtrain-fault-history.json, so that the next job (a
requeue, the next sbatch) starts the nodes that failed before last. Whatever is read
(the file, the key) is decoded and checked: a malformed, corrupted or oversized history
is refused with one error line and counts as empty, never trusted.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Collection

from ...core.clock import Clock
from ...core.rendezvous.fault_history import (
    HISTORY_FILE,
    MAX_BYTES,
    FaultEntry,
    HistoryError,
    HistoryPolicy,
    decode_history,
    encode_history,
    flagged_hosts,
    recent_faults,
    slurm_exclude,
    with_fault,
)
from ..observe.events import emit
from ..store.kv import KeyValueStore

logger = logging.getLogger(__name__)

APPEND_TRIES = 16  # compare_set races: one per concurrent charge, never many


def read_history_file(path: str) -> tuple[FaultEntry, ...]:
    """The history in `path`; () when there is none; HistoryError (one line) for a file
    that is not one. At most MAX_BYTES + 1 bytes are read, whatever the file's size."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise HistoryError(f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise HistoryError(f"over the {MAX_BYTES}-byte bound: not read")
    return decode_history(data)


def write_history_file(path: str, entries: tuple[FaultEntry, ...]) -> None:
    """Write the whole history: a temporary file beside it, renamed over it (a reader
    sees the old history or the new one, never half)."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".fault-history-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(encode_history(entries))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class FaultHistory:
    def __init__(
        self,
        store: KeyValueStore,
        key: str,
        policy: HistoryPolicy,
        clock: Clock,
        run_id: str,
        history_dir: str | None = None,
        slurm_nodes: tuple[str, ...] = (),
    ) -> None:
        self._store = store
        self._key = key
        self._policy = policy
        self._clock = clock
        self._run = run_id[:64]
        self._path = None if history_dir is None else os.path.join(history_dir, HISTORY_FILE)
        self._slurm_nodes = slurm_nodes
        self._refused: set[bytes] = set()  # what was refused, said once

    def _refuse(self, where: str, exc: HistoryError, what: bytes) -> None:
        if what not in self._refused:
            self._refused.add(what)
            logger.error("refusing the fault history in %s: %s; taken as empty", where, exc)

    def _seed(self) -> bytes:
        """The store's history, seeded from the file by the first agent to look."""
        payload = self._store.get(self._key)
        if payload is not None:
            return payload
        entries: tuple[FaultEntry, ...] = ()
        if self._path is not None:
            try:
                entries = read_history_file(self._path)
            except HistoryError as exc:
                self._refuse(self._path, exc, b"file")
        return self._store.set_once(self._key, encode_history(entries))

    def _decoded(self, payload: bytes) -> tuple[FaultEntry, ...]:
        try:
            return decode_history(payload)
        except HistoryError as exc:
            self._refuse(f"the store ({self._key})", exc, payload[:64])
            return ()

    def entries(self) -> tuple[FaultEntry, ...]:
        return self._decoded(self._seed())

    def flagged(self, addrs: Collection[str]) -> dict[str, int]:
        """Which of addrs the history puts last, with their faults in the window (one
        request: the store's key)."""
        if self._policy.faults <= 0:
            return {}
        flagged = flagged_hosts(self.entries(), self._policy, self._clock.wall())
        return {addr: count for addr, count in flagged.items() if addr in addrs}

    def record(self, host: str, kind: str) -> None:
        """Add a fault charged to `host`, in the store and (with --checkpoint-dir) the file;
        say it, and on Slurm the --exclude list for the next submission."""
        now = self._clock.wall()
        entry = FaultEntry(host[:255], kind, now, self._run)
        current = self._seed()
        for _ in range(APPEND_TRIES):
            entries = with_fault(self._decoded(current), entry, now)
            desired = encode_history(entries)
            current = self._store.compare_set(self._key, current, desired)
            if current == desired:
                break
        else:
            logger.warning("fault history: %d concurrent writers; %s not added", APPEND_TRIES, host)
            return
        if self._path is not None:
            try:
                write_history_file(self._path, entries)
            except OSError as exc:
                logger.warning("fault history %s not written: %s", self._path, exc)
        self._say(entries, entry, now)

    def _say(self, entries: tuple[FaultEntry, ...], entry: FaultEntry, now: float) -> None:
        faults = recent_faults(entries, self._policy.window_s, now).get(entry.host, 0)
        flagged = flagged_hosts(entries, self._policy, now)
        emit(
            "fault_history",
            host=entry.host,
            kind=entry.kind,
            faults=faults,
            window_s=self._policy.window_s,
            standby=entry.host in flagged,
            kept_in=self._path or "store",
        )
        exclude = slurm_exclude(set(flagged), self._slurm_nodes)
        if exclude:
            logger.warning(
                "fault history: %d node(s) at %d+ faults in %gs; for the next submission: "
                "sbatch --exclude=%s",
                sum(node in flagged for node in self._slurm_nodes),
                self._policy.faults,
                self._policy.window_s,
                exclude,
            )
            emit("slurm_exclude", exclude=exclude, hosts=sorted(flagged))
