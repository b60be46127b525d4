"""Reaching the job's TCPStore (agent/store/opening.py): a node waits for the store as
long as join_timeout allows, saying on what it waits, however late the host answers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.distributed as dist

from rtrain.agent.store import opening
from rtrain.agent.store.backends import open_job_store
from rtrain.agent.store.opening import (
    listening_socket,
    listens_beyond_loopback,
    open_rendezvous_store,
)

from .fakes import launch_spec


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler, log = Lines(), logging.getLogger(opening.__name__)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)
    log.setLevel(level)


def _until(condition: Callable[[], bool], bound: float) -> bool:
    end = time.monotonic() + bound
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_a_node_waits_for_a_store_host_still_starting_past_10s(lines: Lines) -> None:
    """Issue 31: the second node of a localhost job gave up after a fixed 10 s ("no
    rendezvous store answered within 10s") while node 0 had bound the store's port and
    was still importing torch. Here the port is bound and listening, as node 0 leaves it,
    and the store starts on it only after the waiting node's first 10 s line."""
    bound = listening_socket("127.0.0.1", 0)  # bound at once; its port read back
    assert bound is not None
    port = bound.getsockname()[1]
    result: dict[str, Any] = {}

    def join() -> None:
        try:  # not told whether it hosts: the port is taken, so it joins as a client
            result["opened"] = open_rendezvous_store("127.0.0.1", port, None, None, 60.0, 10.0)
        except Exception as exc:
            result["error"] = exc

    joiner = threading.Thread(target=join, daemon=True)
    started = time.monotonic()
    joiner.start()
    assert _until(lambda: any("waiting for" in m for m in lines.messages), 30), result
    assert time.monotonic() - started >= opening.WAIT_LINE_S and not result
    [line] = [m for m in lines.messages if "waiting for" in m]
    assert f"the rendezvous store at 127.0.0.1:{port}" in line and "up to 60s" in line
    server = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=bound.detach()
    )
    joiner.join(30)
    assert "opened" in result, result
    opened = result["opened"]
    assert not opened.is_host
    opened.store.set("joined", "yes")
    assert server.get("joined") == b"yes"


def test_a_wait_for_the_store_ends_at_a_signal() -> None:
    """A wait of up to join_timeout (30 s here) stays responsive: the agent's signal
    check (it raises once a signal came) is called while the store does not answer."""
    bound = listening_socket("127.0.0.1", 0)  # listens; nothing will ever answer
    assert bound is not None
    port = bound.getsockname()[1]
    spec = launch_spec(
        "--nnodes=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-conf=is_host=false,join_timeout=30",
    )
    checks: list[float] = []

    def interrupt() -> None:
        checks.append(time.monotonic())
        if len(checks) == 3:
            raise KeyboardInterrupt  # what the agent's check raises after SIGTERM

    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            open_job_store(spec.rdzv, None, interrupt)
    finally:
        bound.close()
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize(
    ("host", "etcd", "beyond"),
    [
        ("127.0.0.1", False, False),
        ("127.0.0.5", False, False),
        ("::1", False, False),
        ("localhost", False, True),  # a name: TCPStore listens on every interface
        ("10.1.2.3", False, True),
        ("0.0.0.0", False, True),
        ("127.0.0.1", True, True),  # etcd listens where its operator put it
    ],
)
def test_where_a_store_listens_beyond_loopback(host: str, etcd: bool, beyond: bool) -> None:
    assert listens_beyond_loopback(host, etcd) is beyond
