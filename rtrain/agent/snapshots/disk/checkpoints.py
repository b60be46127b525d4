"""Disk checkpoints: the last resort when no copy of some shard survives in memory.

With --checkpoint-dir and --checkpoint-every N, the replicator hands every N-th step's
shard to a DiskCheckpointer, which copies it (one memory copy) and writes it from its
own thread, so training never waits for the disk. The layout, shared by all nodes
(a shared file system, like torch.distributed.checkpoint's):

  <dir>/step-<S>/rank-<R>.shard    the shard, written to a temporary name and renamed
  <dir>/step-<S>/rank-<R>.json     its manifest, written once the shard is in:
                                   {"step", "rank", "world_size", "size", "sha256",
                                    "crcs", "mac"}
  <dir>/rtrain.key                 the key, when the job was given no secret (mode 0600)

A step is complete when every rank 0..W-1 has both files and every manifest's MAC is
good. Restore reads the newest complete step, checks each shard's size, SHA-256 and
checksums against its manifest, and says it came from disk.

Nothing is left behind: a write that fails (a full disk: ENOSPC) removes its partial
files, and its step folder if that is then empty, so the newest complete step stays
readable and the disk does not fill further; a rewrite of a step removes the old
manifest before the shard is replaced (a new shard never sits under an old manifest),
and one of identical bytes is not written at all. The log says a failure once per
streak of them, with their count when a write succeeds again. After each step written,
the step folders older than the newest `keep` complete steps are deleted
(--keep-checkpoints; 0 keeps all).

A shared checkpoint folder is writable by more than this job, and a shard read from it
becomes training state, so nothing there is trusted that this job did not write: each
manifest carries HMAC-SHA256 of its fields (the shard's SHA-256 among them) under the
checkpoint key. The key is the job secret when one was given (RTRAIN_SECRET or
--secret-file: a requeued or relaunched job given the same secret resumes), else a
random key the first agent writes to <dir>/rtrain.key, readable by its owner only, so
that whoever can plant files in the folder but not read that one cannot forge a step.
A shard holds no pickle (core/snapshots/skeleton.py), so even a trusted one runs no code.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import hmac
import json
import logging
import os
import queue
import re
import secrets
import shutil
import stat
import threading
from dataclasses import dataclass
from typing import Any

from ....core.errors import UsageError
from ..checksums import verify

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"step-(\d+)$")
KEY_FILE = "rtrain.key"
MAX_MANIFEST = 1 << 20  # bytes: one 8-byte digest per 8 MiB chunk fits 500 GB shards
MAC_CONTEXT = b"rtrain disk checkpoint v1\0"


@dataclass(frozen=True)
class CheckpointDir:
    """A checkpoint folder and the key its manifests are signed with."""

    path: str
    key: bytes

    def __repr__(self) -> str:  # never print the key
        return f"CheckpointDir({self.path!r})"


def open_checkpoint_dir(path: str, secret: bytes | None) -> CheckpointDir:
    """The folder with its key: the job secret if one was given, else <path>/rtrain.key,
    made by whichever agent comes first (UsageError if it is not this user's alone)."""
    if secret is not None:
        return CheckpointDir(path, secret)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--checkpoint-dir {path}: {exc.strerror}") from None
    key_path = os.path.join(path, KEY_FILE)
    for _ in range(2):
        key = _read_key(key_path)
        if key is not None:
            return CheckpointDir(path, key)
        _create_key(key_path)
    raise UsageError(f"--checkpoint-dir {path}: cannot create {KEY_FILE}")


def _read_key(key_path: str) -> bytes | None:
    try:
        fd = os.open(key_path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{key_path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UsageError(
                f"{key_path}: not a file only this user can read (mode "
                f"{stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}); checkpoints "
                "signed with it cannot be trusted: remove it or give RTRAIN_SECRET"
            )
        key = os.read(fd, 4097).strip()
    finally:
        os.close(fd)
    if not 16 <= len(key) <= 4096:
        raise UsageError(f"{key_path}: not a checkpoint key (16 to 4096 bytes)")
    return key


def _create_key(key_path: str) -> None:
    """Write a fresh key under a temporary name and link it into place: link fails if
    another agent's key got there first, and then that one is read."""
    temporary = f"{key_path}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_hex(32).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, key_path)
    except FileExistsError:
        pass
    finally:
        os.remove(temporary)


def _mac(key: bytes, fields: dict[str, Any]) -> str:
    body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, MAC_CONTEXT + body, hashlib.sha256).hexdigest()


class DiskCheckpointer:
    def __init__(self, directory: CheckpointDir, every: int, keep: int = 0) -> None:
        """keep: complete steps kept in the folder (0: all)."""
        self.directory = directory
        self.every = every
        self.keep = keep
        self._queue: queue.Queue[tuple[int, int, int, bytes, list[int]] | None] = queue.Queue()
        self._pending: set[int] = set()  # ranks with a write queued or in progress
        self._lock = threading.Lock()
        self._failed = 0  # writes failed since the last that succeeded
        self._skipped = 0  # steps skipped since the last write that succeeded
        self._pruned_after = -1  # the newest step written when the folder was last pruned
        self._thread = threading.Thread(target=self._run, name="rtrain-checkpoint", daemon=True)
        self._thread.start()

    def offer(self, rank: int, step: int, world_size: int, buffer: bytes, crcs: list[int]) -> None:
        """Queue this shard if its step is due; while the rank's previous checkpoint is
        still being written, this one is skipped (training never waits for the disk)."""
        if self.every <= 0 or step % self.every:
            return
        with self._lock:
            if rank in self._pending:
                self._skipped += 1
                if self._skipped == 1:
                    logger.warning(
                        "disk checkpoint of rank %d step %d skipped: the previous one is "
                        "writing (further skips are counted until a write succeeds)",
                        rank,
                        step,
                    )
                return
            self._pending.add(rank)
        self._queue.put((rank, step, world_size, bytes(buffer), crcs))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)
        if self._failed:
            logger.error(
                "%d disk checkpoint write(s) failed since the last that succeeded", self._failed
            )

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            rank, step, world_size, data, crcs = item
            try:
                write_checkpoint(self.directory, rank, step, world_size, data, crcs)
            except OSError as exc:
                self._failed += 1
                if self._failed == 1:
                    logger.error(
                        "disk checkpoint of rank %d step %d failed: %s; its partial files "
                        "were removed, training goes on, the newest complete checkpoint "
                        "stays (further failures are counted until a write succeeds)",
                        rank,
                        step,
                        exc,
                    )
            else:
                self._succeeded(rank, step)
            finally:
                with self._lock:
                    self._pending.discard(rank)

    def _succeeded(self, rank: int, step: int) -> None:
        with self._lock:
            failed, skipped = self._failed, self._skipped
            self._failed = self._skipped = 0
        if failed or skipped:
            logger.warning(
                "disk checkpoints written again (rank %d step %d) after %d failed and %d skipped",
                rank,
                step,
                failed,
                skipped,
            )
        if self.keep > 0 and step > self._pruned_after:
            self._pruned_after = step
            prune_checkpoints(self.directory, self.keep)


def _step_folder(directory: CheckpointDir, step: int) -> str:
    return os.path.join(directory.path, f"step-{step:09d}")


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _same_as_written(directory: CheckpointDir, rank: int, step: int, data: Any) -> bool:
    """Whether `rank`'s shard of `step` is in the folder with these very bytes."""
    try:
        fields = read_manifest(directory, step, rank)
        shard = os.path.join(_step_folder(directory, step), f"rank-{rank}.shard")
        return os.path.getsize(shard) == fields["size"] == len(data) and hmac.compare_digest(
            hashlib.sha256(data).hexdigest(), fields["sha256"]
        )
    except (OSError, ValueError):
        return False


def write_checkpoint(
    directory: CheckpointDir, rank: int, step: int, world_size: int, data: Any, crcs: list[int]
) -> None:
    """One rank's shard of `step`; the manifest, written last, says it is whole. A
    failed write (OSError) leaves none of its files behind."""
    if _same_as_written(directory, rank, step, data):
        return
    folder = _step_folder(directory, step)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank-{rank}.shard")
    manifest = os.path.join(folder, f"rank-{rank}.json")
    fields = {
        "step": step,
        "rank": rank,
        "world_size": world_size,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "crcs": crcs,
    }
    try:
        _remove(manifest)  # a rewrite: no new shard under the old manifest
        with open(path + ".tmp", "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".tmp", path)
        with open(manifest + ".tmp", "w") as handle:
            json.dump({**fields, "mac": _mac(directory.key, fields)}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(manifest + ".tmp", manifest)
    except BaseException:
        for leftover in (path + ".tmp", manifest + ".tmp", path):  # path: no manifest now
            with contextlib.suppress(OSError):
                os.remove(leftover)
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only if no other rank wrote there
        raise


def _steps(directory: CheckpointDir) -> list[tuple[int, str]]:
    """Every step folder, newest first."""
    steps = []
    for folder in glob.glob(os.path.join(directory.path, "step-*")):
        match = STEP_DIR.search(folder)
        if match:
            steps.append((int(match[1]), folder))
    return sorted(steps, reverse=True)


def prune_checkpoints(directory: CheckpointDir, keep: int) -> list[int]:
    """Delete the step folders older than the newest `keep` complete steps (complete or
    not: an older incomplete step is of no use once a newer one is complete); the steps
    deleted. Several agents may prune one shared folder at once."""
    kept = 0
    deleted = []
    for step, folder in _steps(directory):
        if kept >= keep:
            shutil.rmtree(folder, ignore_errors=True)
            deleted.append(step)
        elif _complete(directory, step, folder) is not None:
            kept += 1
    if deleted:
        logger.info("disk checkpoints: deleted steps %s (kept the newest %d)", deleted, keep)
    return deleted


def read_manifest(directory: CheckpointDir, step: int, rank: int) -> dict[str, Any]:
    """The manifest of `rank` at `step`, if this job wrote it (ValueError if not)."""
    path = os.path.join(directory.path, f"step-{step:09d}", f"rank-{rank}.json")
    with open(path, "rb") as handle:
        raw = handle.read(MAX_MANIFEST + 1)
    try:
        manifest = json.loads(raw) if len(raw) <= MAX_MANIFEST else None
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("mac"), str):
        raise ValueError(f"{path} is not a manifest rtrain wrote: refused")
    fields = {k: v for k, v in manifest.items() if k != "mac"}
    if not hmac.compare_digest(manifest["mac"], _mac(directory.key, fields)):
        raise ValueError(
            f"{path} was not written by this job (its HMAC does not match the checkpoint "
            "key): refused"
        )
    counts = ("step", "rank", "world_size", "size")
    if (
        any(type(fields.get(k)) is not int or fields[k] < 0 for k in counts)
        or (fields["step"], fields["rank"]) != (step, rank)
        or not isinstance(fields.get("sha256"), str)
        or not isinstance(fields.get("crcs"), list)
        or any(type(c) is not int for c in fields["crcs"])
    ):
        raise ValueError(f"{path} does not describe rank {rank} at step {step}: refused")
    return fields


def _complete(directory: CheckpointDir, step: int, folder: str) -> int | None:
    """The world size of `step` if every rank finished it, else None. A step with a
    manifest this job did not write is passed over, and said so."""
    try:
        world = read_manifest(directory, step, 0)["world_size"]
        if world < 1 or not all(
            os.path.exists(os.path.join(folder, f"rank-{r}.shard"))
            and read_manifest(directory, step, r)["world_size"] == world
            for r in range(world)
        ):
            return None
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.error("disk checkpoint of step %d passed over: %s", step, exc)
        return None
    return int(world)


def newest_complete(directory: CheckpointDir) -> tuple[int, int] | None:
    """(step, world size) of the newest checkpoint every rank finished, or None."""
    for step, folder in _steps(directory):
        world = _complete(directory, step, folder)
        if world is not None:
            return step, world
    return None


def load_verified(directory: CheckpointDir, step: int, rank: int) -> bytes:
    """The shard of `rank` at `step` as this job wrote it (OSError/ValueError if not)."""
    fields = read_manifest(directory, step, rank)
    path = os.path.join(_step_folder(directory, step), f"rank-{rank}.shard")
    with open(path, "rb") as handle:
        data = handle.read(fields["size"] + 1)
    if len(data) != fields["size"] or not hmac.compare_digest(
        hashlib.sha256(data).hexdigest(), fields["sha256"]
    ):
        raise ValueError(f"{path} is not the shard its manifest signs: refused")
    if not verify(data, len(data), fields["crcs"]):
        raise ValueError(f"disk checkpoint {path} failed its checksum")
    return data
