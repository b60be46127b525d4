"""The wall time by cause (core/observe/badput/): hand-built event lists through each
cause, the overlaps' precedence, the job's merge of its nodes, a live node's settled
view, and every second to exactly one cause (the seconds add up to the wall time)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtrain.core.observe.badput.causes import CAUSES, PRECEDENCE, Claim, Window, resolve
from rtrain.core.observe.badput.job import job_badput
from rtrain.core.observe.badput.live import node_split, settled_end
from rtrain.core.observe.badput.node import LiveBeats
from rtrain.core.observe.events import Event
from rtrain.core.observe.report import build_report

# Times are whole seconds from 1000: their sums are exact in floating point.
T0 = 1000.0


def ev(name: str, t: float, gen: int | None = None, agent: str = "a", **fields: Any) -> Event:
    return Event(name, T0 + t, agent, 0, gen, fields)


def start(t: float, gen: int, agent: str = "a", restored: int | None = None) -> Event:
    return ev("generation_start", t, gen, agent, restored_step=restored, members=[agent])


def end(
    t: float, gen: int, outcome: str, beats: tuple[float, float] | None, agent: str = "a"
) -> Event:
    """beats: (first step seen, last moved), seconds from T0; the steps seen 0 and 10."""
    fields: dict[str, Any] = {"outcome": outcome, "last_step": None}
    if beats is not None:
        fields.update(first_seen_step=0, first_seen_t=T0 + beats[0], reached_step=10)
        fields["last_beat_t"] = T0 + beats[1]
    return ev("generation_end", t, gen, agent, **fields)


def fault(t: float, gen: int, kind: str = "exit", agent: str = "a", **more: Any) -> Event:
    """A fault `agent` saw at t (on itself, unless `host` says another node)."""
    fields = {"kind": kind, "host": agent, "fault_t": T0 + t, **more}
    return ev("fault", t, gen, agent, **fields)


def job_end(t: float, code: int = 0, agent: str = "a") -> Event:
    return ev("job_end", t, None, agent, exit_code=code, message="")


def split(events: list[Event], until: float) -> dict[str, float]:
    found = job_badput(events, T0, T0 + until)
    assert sum(found.seconds.values()) == pytest.approx(until, abs=1e-9)
    return {cause: s for cause, s in found.seconds.items() if s}


def test_a_clean_run_is_start_up_a_restore_and_training() -> None:
    events = [
        ev("agent_start", 0),
        ev("restore", 9, 0, seconds=1.0),
        start(10, 0, restored=4),
        end(100, 0, "succeeded", (20, 99)),
        job_end(101),
    ]
    # the exit barrier after the script's end is training's
    assert split(events, 101) == {"startup": 19, "restore": 1, "training": 81}


def test_a_crash_restarts_a_hang_waits_and_a_repair_repairs() -> None:
    events = [
        ev("agent_start", 0),
        start(10, 0),
        end(50, 0, "local_failure", (20, 48)),
        fault(50, 0),
        ev("restore", 54, 1, seconds=2.0),
        start(56, 1),
        ev("recovery", 60, 1, at_step=11, first_step=11),
        end(80, 1, "local_failure", (60, 70)),
        fault(80, 1, "hang"),
        start(82, 2),
        ev("repair", 83, 2, from_generation=2, kept=[0], restarted=[1]),
        end(84, 2, "local_failure", (82, 83)),
        start(86, 3),
        end(100, 3, "succeeded", (87, 100)),
        job_end(100),
    ]
    assert split(events, 100) == {
        "startup": 20,
        "training": 28 + 10 + 1 + 13,
        # the stop, the rejoin (the restore's 2 s apart), the start to the first step
        "restart": (50 - 48) + (52 - 50) + (56 - 54) + (60 - 56) + (82 - 80),
        "restore": 2,
        "hang_wait": 10,  # from the last heartbeat step to the end: the hang timeout's wait
        "repair": 1 + 2 + 1,  # gen 2's exit, the gap, gen 3's start to its first step
    }


def test_a_move_without_a_fault_is_rendezvous_and_a_fault_elsewhere_is_restart() -> None:
    moved = [
        ev("agent_start", 0),
        start(1, 0),
        end(10, 0, "membership_change", (2, 9)),
        start(12, 1),
        end(20, 1, "succeeded", (13, 20)),
        job_end(20),
    ]
    assert split(moved, 20) == {"startup": 1 + 1, "training": 7 + 7, "rendezvous": 1 + 2 + 1}
    # the same node's view, another node's fault in generation 0 seen in the job's events
    crashed = [*moved, fault(9, 0, agent="b")]
    assert split(crashed, 20)["restart"] == 4


def test_reduced_size_and_straggler_take_training_and_reduced_size_wins_the_overlap() -> None:
    events = [
        ev("agent_start", 0),
        start(0, 0),
        ev("train_through", 30, 0, kept=[0], joining=[1]),
        ev("straggler", 36, 0, rank=1, since=T0 + 35),
        ev("full_size", 40, 0, joined=[1]),
        ev("straggler_cleared", 45, 0, rank=1),
        ev("straggler", 90, 0, rank=2),  # never cleared: to its generation's last step
        end(100, 0, "succeeded", (0, 95), agent="a"),
        job_end(100),
    ]
    assert split(events, 100) == {"training": 100 - 10 - 5 - 5, "reduced_size": 10, "straggler": 10}


def test_snapshot_overhead_is_taken_from_the_end_of_training() -> None:
    finished = end(50, 0, "succeeded", (10, 50))
    with_cost = Event(
        finished.name,
        finished.t,
        "a",
        0,
        0,
        {**finished.fields, "snapshot_s": 4.0},
    )
    events = [ev("agent_start", 0), start(5, 0), with_cost, job_end(50)]
    assert split(events, 50) == {"startup": 10, "training": 36, "snapshot_overhead": 4}


def test_a_job_that_never_stepped_trained_nothing() -> None:
    events = [
        ev("agent_start", 0),
        start(5, 0),
        end(7, 0, "local_failure", None),
        fault(7, 0),
        job_end(8, code=1),
    ]
    assert split(events, 8) == {"startup": 7, "restart": 1}


def test_a_script_without_heartbeats_trained_from_its_start() -> None:
    events = [ev("agent_start", 0), start(5, 0), end(50, 0, "succeeded", None), job_end(50)]
    assert split(events, 50) == {"startup": 5, "training": 45}


def test_nodes_merge_by_precedence_and_a_spare_holds_nothing_up() -> None:
    a = [
        ev("agent_start", 0),
        start(4, 0),
        end(70, 0, "local_failure", (6, 60)),
        fault(70, 0, "hang"),
        start(75, 1),
        end(100, 1, "succeeded", (76, 100)),
        job_end(100),
    ]
    b = [
        ev("agent_start", 2, agent="b"),
        start(4, 0, "b"),
        end(71, 0, "membership_change", (5, 61), agent="b"),
        start(74, 1, "b"),
        end(100, 1, "succeeded", (78, 100), agent="b"),
        job_end(100, agent="b"),
    ]
    # a spare: waits from the start, admitted into generation 1 only
    spare = [ev("agent_start", 1, agent="c"), start(76, 1, "c")]
    spare += [end(100, 1, "succeeded", (77, 100), agent="c"), job_end(100, agent="c")]
    never = [ev("agent_start", 3, agent="d"), job_end(100, agent="d")]  # never joined
    found = job_badput([*a, *b, *spare, *never], T0, T0 + 100)
    assert sum(found.seconds.values()) == pytest.approx(100, abs=1e-9)
    # training once every node stepped (6, and 78 in generation 1); the hang from the
    # first node's last step to the last node's end; the spare's start-up is only
    # counted from generation 0's end (70), and below the others' restart there
    assert {c: s for c, s in found.seconds.items() if s} == {
        "startup": 6,
        "training": 54 + 22,
        "hang_wait": 71 - 60,
        "restart": 78 - 71,
    }
    assert found.goodput == pytest.approx(0.76)
    assert found.nodes["d"] == {**dict.fromkeys(CAUSES, 0.0), "startup": 97}
    assert sum(found.nodes["c"].values()) == pytest.approx(99)
    assert [w.cause for w in found.timeline] == [
        "startup",
        "training",
        "hang_wait",
        "restart",
        "training",
    ]


def test_a_lost_node_stops_at_its_last_renewal() -> None:
    lost = [ev("agent_start", 0, agent="b"), start(1, 0, "b")]
    survivor = [
        ev("agent_start", 0),
        start(1, 0),
        end(40, 0, "membership_change", (2, 30)),
        # declared at 40, a lease timeout after its last renewal
        fault(40, 0, "lost_node", host="b", fault_t=T0 + 30),
        start(42, 1),
        end(60, 1, "succeeded", (43, 60)),
        job_end(60),
    ]
    found = job_badput([*lost, *survivor], T0, T0 + 60)
    assert sum(found.nodes["b"].values()) == pytest.approx(30)  # its lease's last renewal
    assert {c: s for c, s in found.seconds.items() if s} == {
        "startup": 2,
        "training": 28 + 17,
        "restart": 10 + 3,
    }


def test_overlapping_claims_go_to_the_higher_cause_and_gaps_to_the_fallback() -> None:
    claims = [
        Claim("training", 0, 10, 0),
        Claim("restore", 2, 4, 0),
        Claim("hang_wait", 3, 5, 0),
        Claim("training", 12, 14, 1),
    ]
    assert resolve(claims, 0, 15, "restart") == [
        Window("training", 0, 2),
        Window("restore", 2, 3),
        Window("hang_wait", 3, 5),
        Window("training", 5, 10),
        Window("restart", 10, 12),
        Window("training", 12, 14),
        Window("restart", 14, 15),
    ]
    assert set(PRECEDENCE) == set(CAUSES) and PRECEDENCE[-1] == "training"


def test_a_live_node_counts_up_to_its_settled_instant() -> None:
    events = [ev("agent_start", 0), start(10, 0)]
    assert settled_end(events) == T0 + 10  # no step yet: what it was is not known
    live = LiveBeats(T0 + 20, T0 + 50)
    assert node_split(events, live)["training"] == 30
    assert node_split(events, live)["startup"] == 20
    events += [end(60, 0, "local_failure", (20, 55)), fault(60, 0, "hang")]
    # a failed generation's exit waits for the next start: the hang's fault, a repair
    # or a restore may still say what it was
    assert settled_end(events) == T0 + 55
    assert sum(node_split(events).values()) == 55
    events += [ev("restore", 64, 1, seconds=1.0), start(65, 1)]
    found = node_split(events)
    assert (found["hang_wait"], found["restart"], found["restore"]) == (5, 4, 1)


# one generation: (how long its entry, its training, its exit, how it ended, faults)
GENERATIONS = st.lists(
    st.tuples(
        st.integers(0, 5),
        st.integers(0, 20),
        st.integers(0, 5),
        st.sampled_from(["succeeded", "local_failure", "membership_change", None]),
        st.sampled_from([None, "exit", "hang"]),
        st.booleans(),
    ),
    min_size=0,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(GENERATIONS, min_size=1, max_size=3), st.integers(0, 10))
def test_every_second_goes_to_exactly_one_cause(nodes: list[list[Any]], tail: int) -> None:
    events: list[Event] = []
    for index, generations in enumerate(nodes):
        agent = f"n{index}"
        t = float(index)
        events.append(ev("agent_start", t, agent=agent))
        for gen, (entry, train, leave, outcome, kind, repaired) in enumerate(generations):
            t += entry
            events.append(start(t, gen, agent))
            first, t = t + 1, t + 1 + train
            last, t = t, t + leave
            if outcome is not None:
                events.append(end(t, gen, outcome, (first, last), agent))
            if kind is not None:
                events.append(fault(t, gen, kind, agent))
            if repaired:
                events.append(ev("repair", t, gen, agent, from_generation=gen))
        if tail % 2:
            events.append(job_end(t + tail, agent=agent))
    wall = max(e.t for e in events) - T0 + tail
    found = job_badput(events, T0, T0 + wall)
    assert sum(found.seconds.values()) == pytest.approx(wall, abs=1e-9)
    assert all(s >= 0 for s in found.seconds.values())
    assert list(found.seconds) == list(CAUSES)
    for agent_split in found.nodes.values():
        assert all(s >= 0 for s in agent_split.values())


def test_the_report_carries_the_split_of_its_wall_time() -> None:
    events = [
        ev("agent_start", 0),
        start(10, 0),
        end(50, 0, "local_failure", (20, 48)),
        fault(50, 0, message="exit 3", rank=1, fault_node=0),
        start(56, 1),
        end(80, 1, "succeeded", (60, 80)),
        job_end(80),
    ]
    report = build_report(events)
    assert report.badput is not None
    assert sum(report.badput.seconds.values()) == pytest.approx(report.wall_s, abs=1e-9)
    assert report.badput.seconds["restart"] == 2 + 6 + 4
