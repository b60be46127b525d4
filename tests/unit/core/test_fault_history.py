"""The nodes' fault history, pure (core/rendezvous/fault_history.py): its encoding and
what a bad one is refused for, its bounds, which nodes it puts last within a window on a
fake clock, the close that makes them standbys, and Slurm's --exclude hostlist."""

from __future__ import annotations

import json
from hashlib import sha256

import pytest

from rtrain.core.config.slurm.hostlist import compress_hostlist, expand_hostlist
from rtrain.core.rendezvous.closing import closing_order
from rtrain.core.rendezvous.fault_history import (
    MAX_BYTES,
    MAX_ENTRIES,
    FaultEntry,
    HistoryError,
    HistoryPolicy,
    decode_history,
    demoted_members,
    encode_history,
    flagged_hosts,
    slurm_exclude,
    with_fault,
)
from rtrain.core.rendezvous.protocol import MemberInfo

DAY = 86400.0
POLICY = HistoryPolicy(faults=2, window_s=DAY)


def entry(host: str, when: float, kind: str = "lost_node") -> FaultEntry:
    return FaultEntry(host, kind, when, "job1")


def test_a_history_reads_back_as_written() -> None:
    entries = (entry("n01", 10.0), entry("n02", 20.0, "exit"))
    assert decode_history(encode_history(entries)) == entries


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-7],  # torn
        lambda data: data.replace(b'"n01"', b'"n0X"'),  # a changed host, old checksum
        lambda data: bytes([data[0] ^ 0x01]) + data[1:],  # a flipped bit
        lambda data: b"\x80\x04K\x01.",  # a pickle: never unpickled, not JSON
        lambda data: data.replace(b'"v": 1', b'"v": 9'),
        lambda data: b" " * (MAX_BYTES + 1),  # oversized
    ],
)
def test_a_damaged_history_is_refused(damage) -> None:  # type: ignore[no-untyped-def]
    data = encode_history((entry("n01", 10.0),))
    with pytest.raises(HistoryError) as caught:
        decode_history(damage(data))
    assert "\n" not in str(caught.value)


def test_entries_are_checked_one_by_one() -> None:
    bad = [
        {"host": "", "kind": "exit", "time": 1.0, "run": ""},
        {"host": "a\nb", "kind": "exit", "time": 1.0, "run": ""},
        {"host": "a", "kind": "meteor", "time": 1.0, "run": ""},
        {"host": "a", "kind": "exit", "time": "soon", "run": ""},
        {"host": "a", "kind": "exit", "time": -1.0, "run": ""},
        {"host": "a", "kind": "exit", "time": 1.0, "run": "", "extra": 1},
    ]
    for item in bad:
        body = json.dumps([item], sort_keys=True, separators=(",", ":")).encode()
        data = json.dumps({"v": 1, "entries": [item], "sha256": sha256(body).hexdigest()})
        with pytest.raises(HistoryError, match="entry 0"):
            decode_history(data.encode())


def test_a_history_stays_bounded() -> None:
    entries: tuple[FaultEntry, ...] = ()
    for n in range(3 * MAX_ENTRIES):
        entries = with_fault(entries, FaultEntry("h" * 255, "exit", float(n), "r" * 64), n)
    assert len(entries) <= MAX_ENTRIES
    assert len(encode_history(entries)) <= MAX_BYTES
    assert entries[-1].time == 3 * MAX_ENTRIES - 1  # the newest kept
    old = with_fault((entry("n01", 0.0),), entry("n02", 40 * DAY), 40 * DAY)
    assert [e.host for e in old] == ["n02"]  # past KEEP_S


def test_two_faults_within_the_window_flag_a_node_on_a_fake_clock() -> None:
    now = 1_000_000.0
    history = [entry("n01", now - 3600), entry("n02", now - 2 * DAY)]
    assert flagged_hosts(history, POLICY, now) == {}
    history.append(entry("n01", now - 60))
    history.append(entry("n02", now - 10))  # its first is out of the window
    assert flagged_hosts(history, POLICY, now) == {"n01": 2}
    later = now + DAY  # the clock moves: n01's first fault leaves the window
    assert flagged_hosts(history, POLICY, later - 3599) == {}
    assert flagged_hosts(history, HistoryPolicy(0, DAY), now) == {}  # 0: never


def member(n: int, prev: int | None = None) -> MemberInfo:
    return MemberInfo(node_id=f"id{n}", addr=f"n{n:02d}", local_world_size=1, prev_rank=prev)


def test_a_flagged_joiner_closes_last_as_a_standby() -> None:
    joined = [member(1), member(2), member(3)]
    ordered = closing_order(joined, 2, frozenset(), static=False, last={"n01"})
    assert [m.addr for m in ordered] == ["n02", "n03"]
    addrs = [m.addr for m in joined]
    assert demoted_members(addrs, [m.addr for m in ordered], {"n01"}) == ["n01"]
    # nobody else to take its place: it runs
    ordered = closing_order(joined[:2], 2, frozenset(), static=False, last={"n01"})
    assert sorted(m.addr for m in ordered) == ["n01", "n02"]


def test_a_running_survivor_is_never_moved_for_its_history() -> None:
    joined = [member(3), member(1, prev=0), member(2, prev=1)]
    ordered = closing_order(joined, 2, {"id1", "id2"}, static=False, last={"n01"})
    assert [m.addr for m in ordered] == ["n01", "n02"]


def test_the_slurm_exclude_list_is_a_hostlist_of_the_flagged_job_nodes() -> None:
    nodes = ("gpu01", "gpu02", "gpu03", "gpu07", "login")
    assert slurm_exclude({"gpu01", "gpu02", "gpu07", "10.0.0.9"}, nodes) == "gpu[01-02,07]"
    assert slurm_exclude({"10.0.0.9"}, nodes) == ""


@pytest.mark.parametrize(
    "hosts",
    [["n01", "n02", "n03", "n07"], ["login"], ["a1", "b2", "a3"], ["n009", "n010"], ["n9", "n10"]],
)
def test_compress_hostlist_expands_back(hosts: list[str]) -> None:
    assert sorted(expand_hostlist(compress_hostlist(hosts))) == sorted(hosts)


def test_the_state_network_is_judged_by_its_link_and_the_hosts_others() -> None:
    from rtrain.core.health.network import Interface, choose, link_speed, warnings

    nics = [
        Interface("lo", ("127.0.0.1",), None),
        Interface("eth0", ("10.0.0.5",), 1000.0),
        Interface("ib0", ("10.1.0.5",), 100000.0),
    ]
    slow = choose("10.0.0.5", nics)
    assert (slow.interface, slow.faster) == ("eth0", (("ib0", 100000.0),))
    said = warnings(slow, rate_mbps=50.0)
    assert len(said) == 2 and "ib0" in said[1]
    fast = choose("10.1.0.5", nics)
    assert fast.faster == () and warnings(fast, rate_mbps=40000.0) == []
    assert choose("127.0.0.3", nics).interface == "lo"  # 127/8 is the loopback's
    assert warnings(choose("127.0.0.3", nics), 10.0) == []  # no speed: no judgement
    assert [link_speed(t) for t in ("25000\n", "-1", "", None)] == [25000.0, None, None, None]
