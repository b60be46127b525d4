"""What a freshly forked worker does before and after the training script.

Runs in the child of the zygote (see zygote.py). The child has torch already
imported; it becomes its own session, dies with its parent, takes the worker's
environment and std streams, runs the script the way `python -u script.py` would,
and writes torch's error-file format on an uncaught exception, so that a failure
report has the traceback even when the script does not use `@record`.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import ctypes
import faulthandler
import importlib.machinery
import io
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from types import CodeType, ModuleType, TracebackType
from typing import Any, NoReturn

from ...core.contract.environment import RTRAIN_GENERATION, STACK_FILE
from ...core.rendezvous.failures import error_file_payload
from ..repair.joiner_watch import watch_joiner
from .hang_watch import STACK_SIGNAL

# setproctitle (a maintained package, as gunicorn's and celery's workers use) rewrites the
# process's argument area, which is what ps, top and /proc/PID/cmdline read. Doing it by
# hand would mean finding argv's memory and moving environ out of its way so that a
# title longer than the pool's own command line fits: its C code does both; prctl alone
# names only the 15-byte comm. Missing (an install without its dependencies), the
# workers keep the pool's title.
try:
    import setproctitle as _titles
except ImportError:  # pragma: no cover
    _titles = None  # type: ignore[assignment]

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
EXEC_FAILED = 127

# What the script left behind (its namespace, or the exception that ended it), kept until
# the worker leaves with os._exit, as `python script.py` keeps __main__ until shutdown.
# Freed earlier, a DDP model that holds the last reference to a gloo process group joins
# gloo's threads while holding the GIL, and a thread that needs the GIL hangs the worker
# forever after the script has finished (pytorch#56297; 9 of 25 DDP + DCP runs).
_kept_alive: list[Any] = []


# Opened once, in the zygote: a worker forked while the pool's warm-up thread was inside
# dlopen must not call dlopen itself (the loader's lock is held by a thread it lacks).
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def prepare_titles() -> None:
    """In the pool, before any fork: setproctitle takes the argument area and the
    environment behind it now, while the environment is still the one exec gave this
    process; a worker, which replaces its environment, then has room for a long title.
    The pool's comm is put back (setproctitle's set-up renames it)."""
    if _titles is not None:
        comm = _own_comm()
        _titles.getproctitle()
        _name_comm(comm)


_PLACE = (("rank", "RANK"), ("generation", RTRAIN_GENERATION))


def worker_title(request: dict[str, Any], python: str = sys.executable) -> str:
    """The command line torchrun would start this worker with (`python -u script ARGS`,
    `python -u -m module ARGS`), and its rank and generation where the request has them."""
    module = ["-m"] if request["kind"] == "module" else []
    words = [python, "-u", *module, request["target"], *request["args"]]
    env = request.get("env") or {}
    place = [f"{what} {env[name]}" for what, name in _PLACE if env.get(name)]
    return " ".join(words) + (f" [{', '.join(place)}]" if place else "")


def _set_title(request: dict[str, Any]) -> None:
    """Show the worker in ps, top and /proc/PID/cmdline as torchrun's (worker_title), one
    string (setproctitle's form: a title longer than the pool's command line goes on over
    the environment, where only the first NUL ends it). The comm (top's default column,
    pgrep's name) stays the interpreter's, as under torchrun: setproctitle would set it
    to the title's first 15 bytes."""
    if _titles is None:
        return
    comm = _own_comm()
    _titles.setproctitle(worker_title(request))
    _name_comm(comm)


# This process's comm as exec set it (the interpreter's file name), read before
# setproctitle first renames it; a forked worker inherits it from the pool.
_comm: list[bytes] = []


def _own_comm() -> bytes:
    if not _comm:
        try:
            with open("/proc/self/comm", "rb") as handle:
                _comm.append(handle.read().rstrip(b"\n"))
        except OSError:
            _comm.append(b"")
    return _comm[0]


def _name_comm(comm: bytes) -> None:
    if comm and _LIBC is not None:
        _LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(comm), 0, 0, 0)


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Linux: the kernel sends `sig` to this process when its parent exits."""
    if _LIBC is None:
        return
    if _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def fresh_interpreter(request: dict[str, Any]) -> dict[str, Any]:
    """The request that runs the same entry point in a new interpreter (`python -u`), as
    torchrun starts a worker: nothing of the pool's imports, state or settings. It goes
    through fresh.py, which runs it as a forked worker does (run_fresh_interpreter), so
    an uncaught exception or a non-zero sys.exit reaches the failure report and the
    agent can ask for its stack either way; that costs importing this module (0.1 s,
    no torch)."""
    if request["kind"] == "exec":
        return request
    runner = ["-u", "-m", f"{__package__}.fresh", request["kind"], request["target"]]
    return {
        **request,
        "kind": "exec",
        "target": sys.executable,
        "args": [*runner, *request["args"]],
    }


def run_fresh_interpreter(argv: Sequence[str]) -> NoReturn:
    """A fresh interpreter's worker (fresh_interpreter): KIND TARGET ARGS..., run as
    boot() runs a forked one, from its std streams on; never returns."""
    kind, target, *args = argv
    request = {"kind": kind, "target": target, "args": args, "env": dict(os.environ)}
    _set_title(request)
    _arm_stack_dump()
    watch_joiner(os.environ)
    _finish(_run_python(request))


def reseed() -> None:
    """Seed the random states a fresh interpreter seeds from the OS's entropy (torch's
    default generator, numpy's global state, `random`): a fork has the pool's, so every
    worker of every generation drew the same numbers. CUDA's generators are not touched:
    CUDA is uninitialized in the pool (checked before each fork), so each worker seeds
    its own on first use."""
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    random = sys.modules.get("random")
    if random is not None:
        random.seed()


def boot(request: dict[str, Any], parent_pid: int, inherited_fds: Sequence[int]) -> NoReturn:
    try:
        _become_worker(request, parent_pid, inherited_fds)
        if request["kind"] != "exec":
            reseed()
            _set_title(request)
    except BaseException as exc:  # nothing may unwind back into the zygote's loop
        _safe_write(2, f"rtrain: worker setup failed: {exc!r}\n")
        os._exit(EXEC_FAILED)
    if request["kind"] == "exec":
        _exec(request)
    watch_joiner(request["env"])  # a replacement the kept ranks may finish without
    _finish(_run_python(request))


def _become_worker(request: dict[str, Any], parent_pid: int, inherited_fds: Sequence[int]) -> None:
    os.setsid()
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the zygote died before prctl took effect
        os._exit(EXEC_FAILED)
    for fd in inherited_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    _redirect(request.get("stdout_file"), 1)
    _redirect(request.get("stderr_file"), 2)
    _arm_stack_dump()


# Kept open for the worker's life: faulthandler writes to it from a signal handler.
_stack_file: Any = None


def _arm_stack_dump() -> None:
    """Let the agent ask for this worker's stack when it looks hung (see hang_watch)."""
    global _stack_file
    path = os.environ.get(STACK_FILE)
    if not path:
        return
    _stack_file = open(path, "a")  # noqa: SIM115 - must outlive this function
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)


def _redirect(path: str | None, fd: int) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _exec(request: dict[str, Any]) -> NoReturn:
    argv = [request["target"], *request["args"]]
    try:
        os.execvpe(argv[0], argv, request["env"])
    except OSError as exc:
        _safe_write(2, f"rtrain: cannot execute {argv[0]}: {exc.strerror}\n")
        os._exit(EXEC_FAILED)


def _unbuffered_streams() -> None:
    """Match torchrun, which starts workers with `python -u`."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = "backslashreplace" if name == "stderr" else getattr(old, "errors", "strict")
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(
            sys, name, io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)
        )


def _run_python(request: dict[str, Any]) -> int:
    _unbuffered_streams()
    target, args = request["target"], list(request["args"])
    try:
        if request["kind"] == "module":
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()
            _kept_alive.append(runpy.run_module(target, run_name="__main__", alter_sys=True))
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            _run_script(target)
        return 0
    except SystemExit as exc:
        _kept_alive.append(exc)
        code = _system_exit_code(exc)
        if code != 0:
            # Recorded now, before the interpreter's shutdown (seconds on a loaded node,
            # its sockets already closed): a peer whose collective broke under this exit
            # may be reaped first and the agent stop this worker mid-shutdown, which,
            # with no error file older than the stop, counts as the agent's doing; the
            # culprit then left no record and its node was never charged.
            _write_error_file(exc, f"sys.exit({exc.code!r})")
        return code
    except KeyboardInterrupt as exc:
        traceback.print_exception(type(exc), exc, _user_frames(exc))
        # Die by SIGINT like a plain interpreter does, so the agent sees the signal.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException as exc:
        _kept_alive.append(exc)  # its frames hold the script's locals and globals
        trimmed = _user_frames(exc)
        sys.excepthook(type(exc), exc, trimmed)
        _write_error_file(exc)
        return 1


def _run_script(path: str) -> None:
    """Run a script file as `python path` does: in a fresh module that is
    sys.modules["__main__"] from its first line to the worker's exit (so atexit handlers
    and lingering threads see the script's __main__, as under torchrun)."""
    if not os.path.isfile(path):  # a directory or zip file with a __main__.py
        _kept_alive.append(runpy.run_path(path, run_name="__main__"))
        return
    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    module = ModuleType("__main__")
    module.__file__ = path
    module.__cached__ = None  # type: ignore[attr-defined]
    module.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = module
    _kept_alive.append(module)
    try:
        exec(code, module.__dict__)
    finally:  # CPython removes these once the script is done (pymain_run_file)
        module.__dict__.pop("__file__", None)
        module.__dict__.pop("__cached__", None)


def _user_frames(exc: BaseException) -> TracebackType | None:
    """Drop this module's and runpy's frames from `exc`'s traceback, which then starts in
    the user's script as under torchrun, and return it. Set on the exception itself:
    sys.excepthook prints the exception's own __traceback__ when it has one, whatever
    traceback it is handed (two frames of this module were printed above the user's)."""
    tb = exc.__traceback__
    while tb is not None and _is_launchers(tb.tb_frame.f_code, tb.tb_frame.f_globals):
        tb = tb.tb_next
    exc.__traceback__ = tb
    return tb


# The frames between the launcher and the script: matched by code object (a path
# compares unequal after an install moved the .pyc) and by runpy's module name.
_OWN_CODE = frozenset({_run_python.__code__, _run_script.__code__})


def _is_launchers(code: CodeType, module_globals: Mapping[str, Any]) -> bool:
    return code in _OWN_CODE or module_globals.get("__name__") == "runpy"


def _system_exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _write_error_file(exc: BaseException, message: str | None = None) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):  # torch's @record already wrote it
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        payload = error_file_payload(
            message=message or f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(type(exc), exc, _user_frames(exc))),
            timestamp=time.time(),
        )
        with open(path, "w") as handle:
            handle.write(payload)
    except OSError:
        pass


def _finish(code: int) -> NoReturn:
    """Exit as the interpreter would: join threads, run atexit, flush; never return."""
    shutdown = getattr(threading, "_shutdown", None)
    try:
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _safe_write(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, text.encode(errors="replace"))
