"""TCPStoreClient (agent/store/tcpstore_client.py), the agents' torch-free client of the
job's TCPStore: against the installed torch's real server, both backends, every call
answers what torch's own client answers on the same store (this fails when torch
changes its private wire protocol); the rendezvous store's seam and its key notices
keep their contract over it; and an agent that reaches a store imports no torch."""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist

from rtrain.agent.store.tcpstore_client import StoreLost, StoreWaitTimeout, TCPStoreClient
from rtrain.agent.store.torch_notices import KeyNotices
from rtrain.agent.store.torch_store import UNSET, TorchKeyValueStore
from rtrain.core.errors import StoreUnavailable

from .test_store import keeps_the_contract

SECOND = datetime.timedelta(seconds=1)


@pytest.fixture(params=[True, False], ids=["libuv", "legacy"])
def server(request: pytest.FixtureRequest) -> Iterator[Any]:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=request.param
    )
    yield store
    del store


def _wire(server: Any) -> TCPStoreClient:
    client = TCPStoreClient.connect("127.0.0.1", server.port, 5.0)
    client.set_timeout(datetime.timedelta(seconds=5))
    return client


def _torch(server: Any) -> Any:
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=5 * SECOND)


def _calls(store: Any, tag: str) -> list[object]:
    """The calls an agent makes, in order, and what each answered."""
    k = f"{tag}/"
    return [
        store.set(k + "a", "1"),
        store.set(k + "bin", bytes(range(256)) * 40),
        store.compare_set(k + "a", "1", "2"),  # matches: written
        store.compare_set(k + "a", "1", "3"),  # does not: the value
        store.compare_set(k + "new", "", "first"),  # missing, expected empty: written
        store.compare_set(k + "missing", UNSET, UNSET),  # missing: the expected back
        store.add(k + "n", 5),
        store.add(k + "n", -2),
        store.add(k + "n", 0),
        store.check([k + "a", k + "n"]),
        store.check([k + "a", k + "missing"]),
        store.multi_get([k + "a", k + "bin", k + "new", k + "n"]),
        store.delete_key(k + "new"),
        store.delete_key(k + "new"),
        store.check([k + "new"]),
        store.compare_set(k + "missing", UNSET, UNSET),
        store.num_keys() > 0,
    ]


def test_every_call_answers_as_torchs_client_does(server: Any) -> None:
    wire, torch_client = _wire(server), _torch(server)
    answers = _calls(wire, "wire")
    assert answers == _calls(torch_client, "torch")
    assert answers[2:6] == [b"2", b"2", b"first", UNSET] and answers[6:9] == [5, 3, 3]
    # each sees the other's writes: one store, one protocol
    wire.set("shared", "from the wire")
    assert torch_client.get("shared") == b"from the wire"
    torch_client.set("shared", b"\x00from torch")
    assert torch_client.check(["shared"])  # answered: the set before it was served
    assert wire.multi_get(["shared"]) == [b"\x00from torch"]
    assert server.num_keys() == torch_client.num_keys()
    wire.close()


def test_a_wait_returns_when_the_key_is_set_and_times_out_cancelled(server: Any) -> None:
    wire, writer = _wire(server), _torch(server)
    done: list[float] = []

    def wait() -> None:
        wire.wait(["gen/1/news"], datetime.timedelta(seconds=30))
        done.append(time.monotonic())

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(0.3)
    assert not done  # blocked on the server, not polling
    set_at = time.monotonic()
    writer.set("gen/1/news", "x")
    waiter.join(10)
    assert done and done[0] - set_at < 5
    started = time.monotonic()
    with pytest.raises(StoreWaitTimeout, match="timeout"):
        wire.wait(["gen/2/news"], datetime.timedelta(seconds=0.3))
    assert 0.25 < time.monotonic() - started < 5
    # the cancelled wait left nothing on the connection: the next calls answer right
    assert wire.check(["gen/1/news"]) and not wire.check(["gen/2/news"])
    writer.set("gen/2/news", "y")
    wire.wait(["gen/2/news"], 5 * SECOND)  # set already: returns at once
    assert wire.compare_set("gen/2/news", UNSET, UNSET) == b"y"
    wire.close()


def test_the_store_seam_keeps_its_contract_over_the_wire(server: Any) -> None:
    store = TorchKeyValueStore(_wire(server), "wire", 5.0, connect=lambda: _wire(server))
    keeps_the_contract(store)
    notice = store.notice("closed")
    assert not notice()
    _torch(server).set("closed", "members")
    end = time.monotonic() + 10
    while not notice():
        assert time.monotonic() < end
        time.sleep(0.01)


def test_notices_wait_on_the_wire_and_are_never_woken_wrong(server: Any) -> None:
    """libuv's server wakes a key's waiters when any client compare-sets it, set or not
    (issue 32): the notice confirms with a check and waits again, over this client as
    over torch's; it learns the key set from its wait alone."""
    kv = TorchKeyValueStore(_wire(server), "wire", 5.0)
    notices = KeyNotices(lambda: _wire(server), "wire")
    end = time.monotonic() + 10
    assert not notices.check("closed", lambda: kv.exists("closed"))
    while notices.waiting_on != "closed":
        assert time.monotonic() < end
        time.sleep(0.01)
    while server.libuvBackend and notices.spurious_wakeups == 0:
        assert kv.get("closed") is None  # a compare-set with the sentinel wakes the wait
        assert time.monotonic() < end  # (repeated: the wait may not be on the server yet)
        time.sleep(0.01)
    assert not notices.check("closed", lambda: kv.exists("closed"))
    kv.set("closed", "members")
    while not notices.check("closed", lambda: False):  # known from the wait alone
        assert time.monotonic() < end
        time.sleep(0.01)


def test_a_lost_store_is_worded_as_over_torchs_client_not_a_hang() -> None:
    """The agent's last line when the store's host dies reads as it did over torch's
    client (tests/integration/test_recovery.py asserts it): 'lost the rendezvous store
    at ...' and what to do."""
    own = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    wire = TCPStoreClient.connect("127.0.0.1", own.port, 5.0)
    store = TorchKeyValueStore(wire, f"127.0.0.1:{own.port}", 5.0)
    store.set("k", "v")
    del own  # the server closes its connections
    with pytest.raises(StoreUnavailable, match=r"lost the rendezvous store at .*restart"):
        for _ in range(3):  # a set has no answer: the loss shows at a call that has one
            store.set("k", "w")
            store.get("k")
    with pytest.raises(StoreLost, match="the store"):  # and every call after
        wire.check(["k"])


def test_an_agent_reaches_the_store_without_importing_torch(server: Any) -> None:
    """Issue 36: every agent imported torch to reach the job's TCPStore (64 of them on
    2 cores took 85 s to start, 35 s over etcd). A node that joins the store, takes a
    lease connection and reads and writes through the seam loads no torch."""
    code = (
        "import sys\n"
        "from rtrain.agent.store.backends import open_job_store\n"
        "from rtrain.core.config.launch_spec import build_launch_spec\n"
        "from rtrain.cli.launch_args import parse_launch_args\n"
        "flags = ['--nnodes=2', '--rdzv-backend=c10d']\n"
        f"flags += ['--rdzv-endpoint=127.0.0.1:{server.port}']\n"
        "flags += ['--rdzv-conf=is_host=false', 'train.py']\n"
        "spec = build_launch_spec(parse_launch_args(flags, {}))\n"
        "job = open_job_store(spec.rdzv, None, lambda: None)\n"
        "assert not job.is_host\n"
        "job.kv.set('node/1', 'up')\n"
        "assert job.kv.add('joined', 1) == 1 and job.kv.get('node/1') == b'up'\n"
        "lease = job.connect()\n"
        "lease.set('lease/1', '1')\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
    assert server.get("node/1") == b"up" and server.get("lease/1") == b"1"
