"""`rtrain report` counts a stretch trained at reduced size through a fault (the
`train_through` and `full_size` events, core/observe/report_through.py) as its own cause,
reduced throughput, not lost time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtrain.core.observe.events import Event, event_line, parse_event
from rtrain.core.observe.report import build_report
from rtrain.core.observe.report_through import (
    FULL_SIZE,
    GENERATION_END,
    REPORT_END,
    NodeReduced,
    reduced_stretches,
)

CRASH = {
    "kind": "signal",
    "rank": 1,
    "fault_node": 0,
    "host": "a",
    "fault_t": 1010.0,
    "message": "rank 1 was killed by SIGKILL",
}
SHARES = {"0": [0], "2": [1, 2], "3": [3]}


def ev(name: str, t: float, agent: str, gen: int | None, **fields: Any) -> Event:
    node = 0 if agent == "a" else 1
    event = parse_event(event_line(name, t, agent, node, gen, fields))
    assert event is not None
    return event


def _start(t: float, agent: str, gen: int) -> Event:
    fields = {"nodes": 2, "world_size": 4, "members": ["a", "b"], "restored_step": None}
    return ev("generation_start", t, agent, gen, **fields)


def _end(t: float, agent: str, gen: int, outcome: str, beats: tuple) -> Event:
    first, first_t, reached, last_t = beats
    return ev(
        "generation_end",
        t,
        agent,
        gen,
        outcome=outcome,
        seconds=1.0,
        last_step=None,
        reached_step=reached,
        first_seen_step=first,
        first_seen_t=first_t,
        last_beat_t=last_t,
    )


def _through(t: float, agent: str, kept=(0, 2, 3), joining=(1,), shares=None) -> Event:
    held = SHARES if shares is None else shares
    return ev("train_through", t, agent, 1, kept=list(kept), joining=list(joining), shares=held)


def _full(t: float, agent: str, joined=(), reduced_s: float | None = None) -> Event:
    return ev("full_size", t, agent, 1, joined=list(joined), reduced_s=reduced_s)


def _run(middle: list[Event], end_1: tuple[float, str] = (1100.0, "succeeded")) -> list[Event]:
    """2 nodes x 2 workers (a: ranks 0 1, b: ranks 2 3), a step every 0.1 s; rank 1
    killed at 1010, its peers kept (a repair in place) and trained on in generation 1;
    `middle`: the train-through events; generation 1 ends at end_1."""
    t_end, outcome = end_1
    return [
        _start(1000.0, "a", 0),
        _start(1000.0, "b", 0),
        ev("fault", 1010.2, "a", 0, **CRASH),
        _end(1010.3, "a", 0, "local_failure", (1, 1001.0, 90, 1010.0)),
        _end(1010.3, "b", 0, "membership_change", (1, 1001.0, 90, 1010.0)),
        _start(1011.0, "a", 1),
        _start(1011.0, "b", 1),
        *middle,
        _end(t_end, "a", 1, outcome, (91, 1011.5, 970, 1099.4)),
        _end(t_end, "b", 1, outcome, (91, 1011.5, 970, 1099.4)),
        ev("job_end", t_end + 0.1, "a", 1, exit_code=0, message="all workers succeeded"),
        ev("job_end", t_end + 0.1, "b", 1, exit_code=0, message="all workers succeeded"),
    ]


JOINED = [
    _through(1011.5, "a"),
    _through(1011.6, "b"),
    _full(1039.8, "b", (), 28.2),
    _full(1040.0, "a", (1,), 28.5),
]


def test_a_stretch_ended_by_full_size_costs_its_missing_share() -> None:
    (stretch,) = build_report(_run(JOINED)).reduced
    assert (stretch.generation, stretch.start, stretch.end) == (1, 11.5, 40.0)
    assert stretch.seconds == pytest.approx(28.5) and stretch.until == FULL_SIZE
    assert (stretch.ranks, stretch.world, stretch.fraction) == (3, 4, 0.75)
    # 1 rank of 4 missing for 28.5 s: 7.125 s of full-size training not done
    assert stretch.reduced_throughput_s == pytest.approx(28.5 / 4)
    assert stretch.nodes == (
        NodeReduced("a", 11.5, 40.0, FULL_SIZE, (0, 2, 3), (1,), (1,)),
        NodeReduced("b", pytest.approx(11.6), pytest.approx(39.8), FULL_SIZE, (0, 2, 3), (1,)),
    )


def test_a_stretch_with_no_full_size_lasts_until_its_generation_ends() -> None:
    events = _run(JOINED[:2], (1030.0, "local_failure"))
    (stretch,) = build_report(events).reduced
    assert (stretch.start, stretch.end, stretch.until) == (11.5, 30.0, GENERATION_END)
    assert [n.end for n in stretch.nodes] == [30.0, 30.0]
    assert stretch.reduced_throughput_s == pytest.approx(18.5 / 4)
    # a fault in the generation ends it first: the stretch stops when it happened
    fault = ev("fault", 1025.3, "b", 1, **{**CRASH, "rank": 3, "host": "b", "fault_t": 1025.0})
    (stretch,) = build_report(sorted([*events, fault], key=lambda e: e.t)).reduced
    assert (stretch.end, stretch.until) == (25.0, GENERATION_END)
    # no end at all: still reduced at the report's end (its last event)
    running = [e for e in events if e.generation != 1 or e.name not in ("generation_end",)]
    running = [e for e in running if e.name != "job_end"]
    (stretch,) = build_report(running).reduced
    assert (stretch.end, stretch.until) == (pytest.approx(11.6), REPORT_END)


def test_two_nodes_views_merge_into_the_jobs_stretch() -> None:
    # each node says its own kept ranks: their union trains; the joining ones missing
    events = [
        _through(1012.0, "a", (0,), (1,), {"0": [0, 1]}),
        _through(1014.0, "b", (2, 3), (1,), {"2": [2], "3": [3]}),
        _full(1020.0, "a", (1,), 8.0),
        _full(1030.0, "b", (), 16.0),
    ]
    (stretch,) = build_report(_run(events)).reduced
    assert (stretch.start, stretch.end, stretch.ranks, stretch.world) == (12.0, 30.0, 3, 4)
    assert stretch.reduced_throughput_s == pytest.approx(18.0 / 4)
    assert [(n.agent, n.start, n.end) for n in stretch.nodes] == [
        ("a", 12.0, 20.0),
        ("b", 14.0, 30.0),
    ]
    # a node with no kept ranks (its new ones joined) says full size later: it counts
    joiner = ev("full_size", 1032.0, "c", 1, joined=[4], reduced_s=None)
    (stretch,) = build_report(sorted([*_run(events), joiner], key=lambda e: e.t)).reduced
    assert (stretch.end, len(stretch.nodes)) == (32.0, 2)
    # one node full size, the other's generation ended first: not full size again
    events[3] = _full(1031.0, "b", (), 17.0)
    (stretch,) = build_report(_run(events, (1025.0, "local_failure"))).reduced
    assert (stretch.end, stretch.until) == (25.0, GENERATION_END)


def _forged(event: Event, **fields: Any) -> Event:
    return replace(event, fields={**event.fields, **fields})


@pytest.mark.parametrize(
    "bad",
    [
        {"kept": "0 2 3"},
        {"kept": [0, -2]},
        {"kept": [0, True]},
        {"kept": []},
        {"joining": []},
        {"joining": None},
        {"joining": [1, 2], "kept": [0, 2]},  # a rank both kept and joining
        {"shares": [[0]]},
        {"shares": {"x": [0]}},
        {"shares": {"0": "0"}},
    ],
)
def test_a_malformed_train_through_is_left_out(bad: dict[str, Any]) -> None:
    forged = [_forged(e, **bad) if e.name == "train_through" else e for e in JOINED]
    assert build_report(_run(forged)).reduced == []


def test_a_malformed_full_size_or_envelope_is_left_out() -> None:
    forged = [*JOINED[:2], _forged(JOINED[2], joined="all"), _forged(JOINED[3], reduced_s="x")]
    (stretch,) = build_report(_run(forged)).reduced
    assert (stretch.end, stretch.until) == (100.0, GENERATION_END)  # its generation's end
    assert build_report(_run([replace(e, generation=None) for e in JOINED])).reduced == []
    assert build_report(_run([replace(e, generation=True) for e in JOINED])).reduced == []  # type: ignore[arg-type]
    # a full_size before its node's train_through does not end it
    early = [_full(1011.2, "a", (1,), 0.0), *JOINED[:2]]
    assert build_report(_run(early)).reduced[0].end == 100.0


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["kept", "joining", "shares", "joined", "reduced_s"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-2, 4),
            st.floats(allow_nan=True, allow_infinity=True),
            st.text(max_size=3),
            st.lists(st.one_of(st.integers(-1, 4), st.none(), st.text(max_size=1)), max_size=4),
            st.dictionaries(st.text(max_size=2), st.lists(st.integers(-1, 4), max_size=3)),
        ),
    ),
    st.sampled_from([None, -1, 0, 1, 2]),
)
def test_any_fields_make_a_stretch_or_none_never_a_crash(fields: dict, gen: int | None) -> None:
    events = [replace(e, fields={**e.fields, **fields}, generation=gen) for e in JOINED]
    for stretch in build_report(_run(events)).reduced:
        assert 0 < stretch.ranks < stretch.world and stretch.seconds >= 0
        assert 0 <= stretch.reduced_throughput_s <= stretch.seconds


def test_reduced_throughput_is_not_lost_time() -> None:
    """The goodput, the incidents and the time lost are the same with or without the
    stretch: it is trained time, at reduced size."""
    through, plain = build_report(_run(JOINED)), build_report(_run([]))
    assert through.reduced and not plain.reduced
    assert through.goodput == plain.goodput and through.goodput is not None
    assert through.failures == plain.failures
    assert (through.startup_s, through.redone_s) == (plain.startup_s, plain.redone_s)
    assert through.wall_s == plain.wall_s


def test_no_events_no_stretch() -> None:
    assert reduced_stretches([], 0.0, {}, 0.0) == []
    assert build_report([]).reduced == []
