"""TrainingGroup.release() (core/worker/repair/group.py) with real processes over gloo:
a survivor blocked in a sub-group's collective (dist.new_group, as init_device_mesh
makes for a 2-D mesh) on a SIGSTOPped peer is freed at once, not at the group's
timeout, while the sockets the script opened itself (a connection made after the
group, another after the sub-group) still carry data after the release."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.integration.helpers import ROOT

pytestmark = pytest.mark.slow  # two processes over gloo: seconds

TIMEOUT_S = 30  # the groups' timeout: the old release left the survivor blocked that long

WORKER = textwrap.dedent(
    """
    import datetime, json, os, socket, sys, threading, time
    import torch, torch.distributed as dist
    from rtrain.core.worker.repair import group_registry
    from rtrain.core.worker.repair.group import TrainingGroup

    rank, out = int(sys.argv[1]), sys.argv[2]
    timeout = datetime.timedelta(seconds=float(sys.argv[3]))
    group = TrainingGroup("gloo", timeout.total_seconds())

    def pair(server):
        # a connected pair of the script's own (a user's HTTP or data socket)
        client = socket.create_connection(server.getsockname())
        return client, server.accept()[0]

    server = socket.create_server(("127.0.0.1", 0))
    mine = [pair(server)]  # opened after the world group
    sub = dist.new_group([0, 1], timeout=timeout)
    dist.all_reduce(torch.ones(4), group=sub)  # the sub-group connected and working
    mine.append(pair(server))  # opened after the sub-group
    open(os.path.join(out, f"ready{rank}"), "w").close()
    if rank == 1:
        time.sleep(600)  # SIGSTOPped here by the test
    while not os.path.exists(os.path.join(out, "go")):  # rank 1 is stopped
        time.sleep(0.01)
    entering, released = threading.Event(), {}

    def release():
        entering.wait()  # in the collective or about to enter it: it must fail either way
        released["at"] = time.monotonic()
        released["shut"] = group.release()

    threading.Thread(target=release, daemon=True).start()
    entering.set()
    try:
        dist.all_reduce(torch.ones(1024), group=sub)
        error = None
    except Exception as exc:
        error = type(exc).__name__
    blocked_s = time.monotonic() - released["at"]
    echoed = []
    for client, accepted in mine:
        client.sendall(b"ping")
        echoed.append(accepted.recv(4) == b"ping")
    record = {"error": error, "blocked_s": blocked_s, "shut": released["shut"],
              "echoed": echoed, "tracked": group_registry.tracked()}
    with open(os.path.join(out, "rank0.json"), "w") as handle:
        json.dump(record, handle)
    os._exit(0)  # no destroy: rank 1 is stopped
    """
)


def _wait_for(what: str, done: object, procs: list[subprocess.Popen[bytes]]) -> None:
    end = time.monotonic() + 60
    while not done():  # type: ignore[operator]
        assert all(p.poll() is None for p in procs), f"a worker ended before {what}"
        assert time.monotonic() < end, f"no {what} in 60 s"
        time.sleep(0.02)


def test_a_survivor_blocked_in_a_sub_group_on_a_stopped_peer_is_released_at_once(
    tmp_path: Path,
) -> None:
    # The group's store hosted here, bound at once, every rank a client of it (as under
    # an agent): rank 0 binding a port picked ahead raced other tests for it (EADDRINUSE).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "WORLD_SIZE": "2",
    }
    procs = []
    for rank in (0, 1):
        log = open(tmp_path / f"rank{rank}.log", "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(rank), str(tmp_path), str(TIMEOUT_S)],
                env={**env, "RANK": str(rank)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        ready = lambda: all((tmp_path / f"ready{r}").exists() for r in (0, 1))  # noqa: E731
        _wait_for("readiness", ready, procs)
        os.kill(procs[1].pid, signal.SIGSTOP)
        (tmp_path / "go").touch()
        assert procs[0].wait(TIMEOUT_S * 2) == 0, (tmp_path / "rank0.log").read_text()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    record = json.loads((tmp_path / "rank0.json").read_text())
    assert record["error"] is not None  # the collective failed...
    assert record["blocked_s"] < 5  # ...at once (before: at the 30 s timeout)
    assert record["tracked"] is True
    assert record["shut"] >= 2  # the world's connection and the sub-group's, at least
    assert record["echoed"] == [True, True]  # the script's own sockets still work


def test_on_the_checked_torch_the_private_api_is_found() -> None:
    # group_registry wraps torch's private group-creation helper and reads its group
    # registry, both by name: a release that renames either would leave the
    # sub-groups unreleased without a word, so the checked release pins them (CI
    # installs it).
    import torch

    from rtrain.core.worker.repair import group_registry

    release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if release != group_registry.CHECKED_ON:
        pytest.skip(f"torch {torch.__version__}: read on {group_registry.CHECKED_ON}")
    code = (
        "from rtrain.core.worker.repair import group_registry as g;"
        "print(g.track(), g.tracked(), g.open_groups() == [],"
        " isinstance(g._c10d()._world.pg_map, dict))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.stdout.split() == ["True"] * 4, done.stderr
