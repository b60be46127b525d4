"""Which node hosts the job's TCPStore (agent/store/store_host.py): node rank 0 under the
static rendezvous whatever the names; for c10d, torch's rule, the endpoint resolved and
compared with this machine's interface addresses (issue 37 item 1)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from rtrain.agent.store.opening import endpoint_is_local
from rtrain.agent.store.store_host import choose_store_host, endpoint_owner, owns_address


def _non_loopback_address() -> str | None:
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family.name == "AF_INET" and not entry.address.startswith("127."):
                return str(entry.address)
    return None


def test_static_hosts_on_node_rank_0_whatever_the_names() -> None:
    name = "tj-node-0-0.tj.no-such-domain.invalid"
    zero = choose_store_host(name, "static", None, 0, None)
    one = choose_store_host(name, "static", None, 1, None)
    assert zero.hosts is True and "node rank 0" in zero.reason
    assert one.hosts is False and "this is 1" in one.reason
    assert "does not host" in one.line(f"{name}:29500")


def test_is_host_in_rdzv_conf_wins() -> None:
    assert choose_store_host("localhost", "c10d", False, None, None).hosts is False
    assert choose_store_host("203.0.113.9", "static", True, 1, None).hosts is True


def test_an_interface_address_not_behind_the_hostname_is_this_machines() -> None:
    """Trainer v2's `tj-node-0-0.tj` resolves to the pod's address, which the hostname
    `tj-node-0-0` is not: comparing names and loopback (before) said no pod hosts."""
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    owner = endpoint_owner(address, None)
    assert owner.hosts is True, owner.reason
    assert "an address of this machine" in owner.reason
    assert endpoint_is_local(address, None)
    # c10d: several agents on one machine may own it; the first to bind hosts
    assert choose_store_host(address, "c10d", None, None, None).hosts is None


def test_an_address_elsewhere_is_not() -> None:
    owner = endpoint_owner("203.0.113.77", None)  # TEST-NET-3: no machine's here
    assert owner.hosts is False
    assert "not an address of this machine" in owner.reason
    assert not owns_address("203.0.113.77")
    assert owns_address("127.0.0.5") and owns_address("::1")


def test_a_name_that_does_not_resolve_is_another_nodes() -> None:
    owner = endpoint_owner("no-such-pod.no-such-domain.invalid", None)
    assert owner.hosts is False and "does not resolve" in owner.reason


def test_dry_run_says_which_node_hosts_and_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rtrain.cli.main import run_launch

    monkeypatch.setenv("COLUMNS", "200")  # the table's row on one line

    script = str(Path(__file__).resolve().parents[2] / "scripts" / "train_probe.py")
    flags = ["--dry-run", "--nnodes=2", "--master-addr=tj-node-0-0.tj.invalid", script]
    assert run_launch(["--node-rank=1", *flags], {"COLUMNS": "200"}) == 0
    assert "the static rendezvous hosts it on node rank 0 (this is 1)" in capsys.readouterr().out
    assert run_launch(["--node-rank=0", *flags], {"COLUMNS": "200"}) == 0
    out = capsys.readouterr().out
    assert "store host" in out and "this node: the static rendezvous hosts it on node" in out
