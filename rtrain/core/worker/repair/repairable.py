"""rtrain.repairable: repair in place. A fault elsewhere in the job stops only what
failed; this worker's process (its CUDA context, compiled modules, data loaders, host
objects) lives on into the next generation.

    @rtrain.repairable
    def train() -> None:
        ...  # rtrain opened the process group; restore(), train, snapshot()

    train()

The function is called once per generation this process takes part in. On a fault
elsewhere the agent asks the worker to repair (request.json in its control folder,
core/contract/repair_files.py): a watcher thread shuts down the group's connections, so
the collective the function is blocked in (or its next one) raises; the function's
frames unwind; rtrain destroys the group, says "parked", waits for the next
generation's environment, opens the new group (new rank, world size, store) and calls
the function again, which restores the newest step every rank committed. A function
that raises on its own, with no request, fails the worker as today. Without rtrain (or
under an agent that does not repair) the function runs once in a group opened from the
environment, as torchrun would.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ...clock import wait_until
from ...contract.environment import RTRAIN_GENERATION
from ...contract.repair_files import (
    INTERIM,
    PARKED,
    REPAIR_DIR,
    REPAIR_WAIT,
    REQUEST_FILE,
    RESUME_FILE,
    RESUME_WAIT,
    RUNNING,
    STATE_FILE,
    STUCK,
    WHOLE,
    Resume,
    WorkerState,
    decode_request,
    decode_resume,
    encode_state,
)
from ...rendezvous.failures import is_collective_error
from .. import shares
from . import through, warm_spare
from .asked import ASKED
from .group import TrainingGroup
from .mesh_caches import forget_meshes

__all__ = ["RepairError", "repairable", "repairs"]

F = TypeVar("F", bound=Callable[..., Any])
POLL_S = 0.01
DEFAULT_WAIT_S = 30.0
DEFAULT_RESUME_S = 900.0
# A training thread still in the function this long after its group's release, with
# the whole process using under IDLE_CPU_FRACTION of a core over IDLE_WINDOW_S, is
# stuck (the agent stops it after ACK_S = 5 s otherwise).
STUCK_AFTER_S = 1.0
IDLE_WINDOW_S = 0.5
IDLE_CPU_FRACTION = 0.1
CHECKPOINT_API = "torch.distributed.checkpoint.api"


class RepairError(RuntimeError):
    """The agent did not hand this parked worker a next generation in time."""


class _Count:
    repairs = 0


def repairs() -> int:
    """How many times this process was repaired into a new generation (0: never)."""
    return _Count.repairs


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(1 << 20)
    except OSError:
        return None


class _Control:
    """This worker's side of its control folder."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.wait_s = float(os.environ.get(REPAIR_WAIT, "") or DEFAULT_WAIT_S)
        self.resume_s = float(os.environ.get(RESUME_WAIT, "") or DEFAULT_RESUME_S)

    @classmethod
    def from_env(cls) -> _Control | None:
        folder = os.environ.get(REPAIR_DIR)
        return cls(folder) if folder and os.path.isdir(folder) else None

    def say(self, state: str, generation: int, group: str = WHOLE) -> None:
        path = os.path.join(self.folder, STATE_FILE)
        with open(path + ".tmp", "wb") as handle:
            handle.write(encode_state(WorkerState(state, generation, os.getpid(), group)))
        os.replace(path + ".tmp", path)

    def requested(self, generation: int) -> bool:
        asked = decode_request(_read(os.path.join(self.folder, REQUEST_FILE)))
        return asked is not None and asked >= generation

    def wait_request(self, generation: int) -> bool:
        return wait_until(
            lambda: self.requested(generation), self.wait_s, POLL_S, time.monotonic, time.sleep
        )

    def wait_resume(
        self, generation: int, timeout_s: float | None = -1.0, poll_s: float = POLL_S
    ) -> Resume | None:
        """The resume addressed to this process for a later generation; None after
        timeout_s (-1: this worker's resume wait; None: no limit, a warm spare's)."""
        found: list[Resume] = []

        def arrived() -> bool:
            resume = decode_resume(_read(os.path.join(self.folder, RESUME_FILE)))
            # addressed to this process: a stale one (stopped, replaced) never enters
            if resume is not None and resume.generation > generation and resume.pid == os.getpid():
                found.append(resume)
            return bool(found)

        limit = self.resume_s if timeout_s == -1.0 else timeout_s
        wait_until(arrived, limit, poll_s, time.monotonic, time.sleep)
        return found[0] if found else None


class _Watcher:
    """A thread that releases the group as soon as the agent asks for a repair, then
    says "stuck" if the training thread stays blocked, idle, after the release."""

    def __init__(
        self,
        control: _Control,
        generation: int,
        group: TrainingGroup,
        stuck_after_s: float = STUCK_AFTER_S,
    ) -> None:
        self.asked = threading.Event()
        self.left = threading.Event()  # the training thread is out of the function
        self._stop = threading.Event()
        self._control, self._generation, self._group = control, generation, group
        self._stuck_after_s = stuck_after_s
        self._thread = threading.Thread(target=self._run, name="rtrain-repair", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            if self._control.requested(self._generation):
                self.asked.set()
                ASKED.set()  # a snapshot's wait for its replication ends too
                self._group.release()
                self._watch_stuck()
                return

    def _watch_stuck(self) -> None:
        """After the release every collective of the group fails at once, so a training
        thread still in the function a while later either computes (the process busy)
        or waits on what the release could not wake (the process idle): gloo's send
        queued on a closed pair sleeps out the group's timeout. That one is worth a
        restart now; a busy one is left to finish and park, or to the agent's wait."""
        if self.left.wait(self._stuck_after_s):
            return
        used = time.process_time()  # every thread of the process
        if self.left.wait(IDLE_WINDOW_S):
            return
        if time.process_time() - used < IDLE_CPU_FRACTION * IDLE_WINDOW_S:
            self._control.say(STUCK, self._generation)

    def stop(self) -> None:
        self.left.set()
        self._stop.set()
        self._thread.join()


def _checkpoint_failure(exc: BaseException) -> bool:
    """Whether `exc` is DCP's CheckpointException: a BaseException (not an Exception),
    raised on every rank when one rank's part of a dcp.save or dcp.load failed, a
    released collective's error included."""
    api = sys.modules.get(CHECKPOINT_API)  # none raised if DCP was never imported
    found = getattr(api, "CheckpointException", None)
    return isinstance(found, type) and isinstance(exc, found)


def _peer_may_have_failed(exc: BaseException) -> bool:
    """Whether `exc` is what a collective raises when a peer fails: worth waiting for
    the agent's request. A RuntimeError says so only in its type, text or traceback (a
    gloo transport error, an aborted NCCL communicator, DistBackendError: the markers
    core/rendezvous/failures.py reads victims by); any other, torch's OutOfMemoryError
    or the script's own RuntimeError, fails this worker at once, as a ValueError does,
    rather than leave every rank waiting WORKER_WAIT_S for a request that never comes.
    DCP's CheckpointException is raised on every rank when one rank's part failed."""
    if _checkpoint_failure(exc):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    names = " ".join(cls.__name__ for cls in type(exc).__mro__)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return is_collective_error(f"{names}\n{text}")


def _generation() -> int:
    found = os.environ.get(RTRAIN_GENERATION) or os.environ.get("TORCHELASTIC_RESTART_COUNT")
    return int(found or 0)


@overload
def repairable(fn: F) -> F: ...
@overload
def repairable(
    fn: None = None,
    *,
    backend: str | None = None,
    timeout_s: float | None = None,
    train_through: bool = False,
) -> Callable[[F], F]: ...
def repairable(
    fn: F | None = None,
    *,
    backend: str | None = None,
    timeout_s: float | None = None,
    train_through: bool = False,
) -> F | Callable[[F], F]:
    """Mark `fn` (the training function, called with the wrapper's arguments) as one
    rtrain may repair in place. backend: the process group's (None: torch's default for
    the devices present); timeout_s: its collectives' timeout (None: torch's);
    train_through: the kept workers train on while a replacement starts up, the
    missing ranks' data done by peers (the script takes its data by rtrain.data_ranks()
    and averages by rtrain.average_gradients(): core/worker/repair/through.py)."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            return _run(function, args, kwargs, backend, timeout_s, train_through)

        return run  # type: ignore[return-value]

    return wrap if fn is None else wrap(fn)


def _run(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    backend: str | None,
    timeout_s: float | None,
    train_through: bool = False,
) -> Any:
    control = _Control.from_env()
    if control is None:
        group = TrainingGroup(backend, timeout_s)
        try:
            return fn(*args, **kwargs)
        finally:
            group.close()
    if warm_spare.is_spare():  # warm, parked until the agent gives it a rank
        warm_spare.take_rank(control)
        control = _Control.from_env()
        assert control is not None, "a spare's resume names its rank's control folder"
    try:
        call = functools.partial(fn, *args, **kwargs)
        return _generations(call, backend, timeout_s, control, train_through)
    finally:
        ASKED.clear()  # out of the loop, no generation of this process is being repaired


def _generations(
    call: Callable[[], Any],
    backend: str | None,
    timeout_s: float | None,
    control: _Control,
    train_through: bool = False,
) -> Any:
    """call() once per generation this process takes part in, repaired between (and
    once more in a generation whose warm replacement joined: through.py)."""
    generation = _generation()
    while True:
        part = through.role(train_through, _Count.repairs > 0)
        interim = part is through.Role.KEPT
        while True:  # a kept worker's interim group, then the whole one
            opened = _open(part, interim, backend, timeout_s, generation, control.resume_s)
            if opened is None:  # the kept ranks finished before this new one was warm
                return None
            group, ended = opened
            ASKED.clear()
            control.say(RUNNING, generation, INTERIM if interim else WHOLE)
            watcher = _Watcher(control, generation, group)
            try:
                result = call()
            except through.Regroup:
                watcher.stop()
                assert ended is not None
                ended.close()
                interim = False
                continue
            except BaseException as exc:
                shares.leave()
                watcher.left.set()
                if not isinstance(exc, Exception) and not _checkpoint_failure(exc):
                    watcher.stop()  # else it lives on, and a later request sets ASKED
                    group.close()
                    raise  # KeyboardInterrupt, SystemExit: the process ends, as without repair
                group.release()  # peers blocked on this worker are freed at once
                asked = watcher.asked.is_set() or (
                    _peer_may_have_failed(exc) and control.wait_request(generation)
                )
                watcher.stop()
                if not asked:
                    group.close()
                    raise
                print(
                    f"rtrain: generation {generation} ended under this worker "
                    f"({type(exc).__name__}); repairing in place",
                    file=sys.stderr,
                    flush=True,
                )
                del exc
                break
            else:
                watcher.stop()
                if ended is not None:
                    ended.finish()
                group.close()
                return result
        group.close()
        control.say(PARKED, generation)
        # The old generation's wrappers (DDP, FSDP2) and their hooks go now, while the
        # agent meets the others (a full collection took 0.76 s on a loaded 2-core
        # machine: not before the answer), and with them its meshes, once DTensor's
        # caches forget them (core/worker/repair/mesh_caches.py).
        forget_meshes()
        gc.collect()
        resume = control.wait_resume(generation)
        if resume is None:
            raise RepairError(
                f"parked after generation {generation}, but no next generation came "
                f"within {control.resume_s:g}s"
            )
        os.environ.update(resume.env)
        generation = resume.generation
        _Count.repairs += 1
        with contextlib.suppress(OSError):
            os.remove(os.path.join(control.folder, RESUME_FILE))


def _open(
    part: through.Role | None,
    interim: bool,
    backend: str | None,
    timeout_s: float | None,
    generation: int,
    wait_s: float,
) -> tuple[TrainingGroup, through.Interim | None] | None:
    """The group this worker trains in now, and the interim it is (None: the whole
    generation's); None for a new worker whose kept peers finished the training before
    it was warm. A new worker says it is warm first (and waits up to wait_s for the kept
    ones); once the whole group is open after an interim, the kept ranks' newest
    snapshot goes to the new ones."""
    if interim:
        opened = through.Interim(backend, timeout_s, generation)
        return opened.group, opened
    if part is through.Role.NEW and not through.say_ready(generation, wait_s):
        return None
    group = TrainingGroup(backend, timeout_s)
    if part is not None:
        through.hand_over_state()
    return group, None
