"""Structured events (their schema and parser), the metrics folded from them in
Prometheus' text format, and the report made of a run's events."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from rtrain.core.observe.events import (
    FIELD_TYPES,
    SCHEMA,
    Event,
    EventError,
    event_line,
    parse_event,
    read_events,
)
from rtrain.core.observe.metrics import NodeMetrics
from rtrain.core.observe.report import Span, build_report

CRASH = {
    "kind": "exit",
    "rank": 1,
    "fault_node": 0,
    "host": "10.0.0.1",
    "fault_t": 1000.0,
    "message": "exit 1",
    "detect_s": 0.1,
}


def ev(name: str, t: float, agent: str = "a", node: int | None = 0, gen: int | None = 0, **f):
    event = parse_event(event_line(name, t, agent, node, gen, f))
    assert event is not None
    return event


def test_an_event_round_trips_with_its_envelope() -> None:
    line = event_line("fault", 1000.5, "10.0.0.1", 0, 3, CRASH)
    assert line.endswith("\n") and line.count("\n") == 1
    record = json.loads(line)
    assert {k: record[k] for k in ("v", "event", "t", "agent", "node", "generation")} == {
        "v": 1,
        "event": "fault",
        "t": 1000.5,
        "agent": "10.0.0.1",
        "node": 0,
        "generation": 3,
    }
    event = parse_event(line)
    assert event == Event("fault", 1000.5, "10.0.0.1", 0, 3, CRASH)


@pytest.mark.parametrize(
    ("name", "fields", "fragment"),
    [
        ("nonsense", {}, "unknown event 'nonsense'"),
        ("fault", {**CRASH, "rank": None}, None),
        ("fault", {**CRASH, "kind": None}, "kind of the wrong type"),
        ("recovery", {"from_generation": 0, "down_s": "2", "lost_steps": 1}, "down_s"),
        ("job_end", {"exit_code": 0}, "lacks message"),
        ("job_end", {"exit_code": 0, "message": "x", "t": 1}, "envelope fields"),
        ("job_end", {"exit_code": 0, "message": "x", "note": math.nan}, "not plain JSON"),
        ("job_end", {"exit_code": 0, "message": "x", "note": object()}, "not plain JSON"),
        ("job_end", {"exit_code": math.nan, "message": "x"}, "exit_code of the wrong type"),
    ],
)
def test_rtrain_never_writes_an_event_off_its_schema(name, fields, fragment) -> None:
    if fragment is None:  # a present field may be null: the schema asks for presence
        assert parse_event(event_line(name, 1.0, "a", None, None, fields)) is not None
        return
    with pytest.raises(EventError, match=fragment):
        event_line(name, 1.0, "a", None, None, fields)


def test_every_event_in_the_schema_says_what_it_means() -> None:
    assert all(len(required) >= 1 and len(text) > 20 for required, text in SCHEMA.values())


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(st.text(max_size=200))
def test_any_line_is_an_event_or_none(line: str) -> None:
    event = parse_event(line)
    assert event is None or event.name in SCHEMA


@pytest.mark.slow  # a fuzzer: 2-4 s, too long for the quick loop
@given(
    st.dictionaries(
        st.sampled_from(["v", "event", "t", "agent", "node", "generation", "kind"]), JSON
    )
)
def test_any_json_object_is_an_event_or_none(record: dict) -> None:
    event = parse_event(json.dumps(record))
    if event is not None:
        assert record["v"] == 1 and math.isfinite(event.t)


DEFAULTS = {"text": "x", "list": [], "integer": 0, "number": 0.5, "": 0}
FIELDS = st.sampled_from(
    [
        "down_s",
        "lost_steps",
        "fault_t",
        "seconds",
        "full_bytes",
        "kind",
        "outcome",
        "last_step",
        "restored_step",
        "from_generation",
        "rank",
        "fault_node",
        "host",
        "detect_s",
        "members",
    ]
)


@pytest.mark.slow  # a fuzzer: seconds, not milliseconds
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(SCHEMA)),
            st.floats(-1e3, 1e12),
            st.sampled_from(["a", "b"]),
            st.none() | st.integers(-2, 3),
            st.dictionaries(FIELDS, JSON),
        ),
        max_size=30,
    )
)
def test_a_report_of_any_lines_that_parse_never_fails(rows) -> None:
    """What a forged or garbled events.jsonl may hold: `rtrain report` reads it or skips
    lines, it never crashes on one."""
    lines = []
    for name, t, agent, gen, fields in rows:
        required = {f: DEFAULTS[FIELD_TYPES.get(f, ("", 0))[0]] for f in SCHEMA[name][0]}
        required |= fields
        record = {"v": 1, "event": name, "t": t, "agent": agent, "node": 0, "generation": gen}
        lines.append(json.dumps({**required, **record}))
    events, _ = read_events(lines)
    report = build_report(events)
    assert report.goodput is None or 0 <= report.goodput <= 1


def test_a_torn_last_line_and_other_versions_are_counted_not_read() -> None:
    good = event_line("job_end", 2.0, "a", 0, 0, {"exit_code": 0, "message": "done"})
    lines = [good, '{"v": 2, "event": "job_end"}\n', good[: len(good) // 2]]
    events, bad = read_events(lines)
    assert [e.name for e in events] == ["job_end"] and bad == 2


def test_metrics_fold_the_events_and_parse_as_prometheus_text() -> None:
    metrics = NodeMetrics("job 42", 'n"1')
    for event in (
        ev("fault", 10, **CRASH),
        ev("fault", 11, **{**CRASH, "kind": "lost_node"}),
        ev("recovery", 12, gen=1, from_generation=0, down_s=2.5, lost_steps=3),
        ev("replication", 13, gen=1, replicas=2, sent_bytes=100, full_bytes=400, seconds=0.5),
        ev(
            "restore",
            14,
            gen=1,
            step=7,
            source="memory",
            local=1,
            fetched=1,
            from_dp_peer=0,
            seconds=0.25,
        ),
        ev("gpu", 15, gen=1, verdict="warning", findings=["GPU 0: temperature"]),
    ):
        metrics.apply(event)
    metrics.sample(100.0, 10, 10, 9)
    metrics.sample(102.0, 14, 14, 12)
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition())}
    value = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families.values()
        for s in family.samples
    }
    labels = (("rtrain_node", 'n"1'), ("run_id", "job 42"))
    assert value[("rtrain_generation", labels)] == 1
    assert value[("rtrain_restarts_total", labels)] == 1
    assert value[("rtrain_lost_steps_total", labels)] == 3
    assert value[("rtrain_faults_total", (("kind", "exit"), *labels))] == 1
    assert value[("rtrain_faults_total", (("kind", "lost_node"), *labels))] == 1
    assert value[("rtrain_replicated_bytes_total", labels)] == 400
    assert value[("rtrain_replication_sent_bytes_total", labels)] == 100
    assert value[("rtrain_step", labels)] == 14
    assert value[("rtrain_step_rate", labels)] == 2.0
    assert value[("rtrain_replication_lag_steps", labels)] == 2
    assert value[("rtrain_restore_seconds", labels)] == 0.25
    assert value[("rtrain_gpu_verdict", labels)] == 1
    assert families["rtrain_restarts"].type == "counter"


def test_a_report_gives_each_failure_its_time_and_steps_and_the_run_its_goodput() -> None:
    def start(t, agent, gen, restored, nodes=2):
        members = ["a", "b"][:nodes]
        return ev(
            "generation_start",
            t,
            agent,
            gen=gen,
            nodes=nodes,
            world_size=nodes,
            members=members,
            restored_step=restored,
        )

    def end(t, agent, gen, outcome, last):
        return ev(
            "generation_end",
            t,
            agent,
            gen=gen,
            outcome=outcome,
            seconds=0.0,
            last_step=last,
            reached_step=None,
        )

    events = [
        start(0, "a", 0, None),
        start(0, "b", 0, None),
        # rank 1 crashes at 10 on node a, after step 9 was committed; both restart at 12
        ev("fault", 10.1, "a", gen=0, **{**CRASH, "fault_t": 10.0}),
        end(10.2, "a", 0, "local_failure", 9),
        end(10.3, "b", 0, "membership_change", 9),
        start(12, "a", 1, 8),
        start(12.5, "b", 1, 8),
        ev(
            "recovery",
            12,
            "a",
            gen=1,
            from_generation=0,
            cause="local_failure",
            down_s=1.8,
            lost_steps=1,
        ),
        ev(
            "recovery",
            12.5,
            "b",
            gen=1,
            from_generation=0,
            cause="membership_change",
            down_s=2.2,
            lost_steps=1,
        ),
        ev("replication", 15, "a", gen=1, replicas=10, sent_bytes=5e6, full_bytes=1e7, seconds=0.5),
        # node b is lost at 20 (declared by a, 2 s later); a goes on alone from 24
        ev(
            "fault",
            22,
            "a",
            gen=1,
            **{
                **CRASH,
                "kind": "lost_node",
                "rank": None,
                "fault_node": 1,
                "host": "b",
                "fault_t": 20.0,
                "detect_s": 2.0,
            },
        ),
        end(22.1, "a", 1, "membership_change", 19),
        start(24, "a", 2, 19, nodes=1),
        ev(
            "recovery",
            24,
            "a",
            gen=2,
            from_generation=1,
            cause="membership_change",
            down_s=1.9,
            lost_steps=0,
        ),
        end(34, "a", 2, "succeeded", 29),
    ]
    report = build_report(events)
    assert [n.agent for n in report.nodes] == ["a", "b"]
    a = report.nodes[0]
    assert [(s.generation, s.outcome) for s in a.generations] == [
        (0, "local_failure"),
        (1, "membership_change"),
        (2, "succeeded"),
    ]
    # b never said its generation 1 ended: a declared it lost, its lease last renewed at 20
    assert report.nodes[1].generations[-1] == Span(1, 12.5, 20.0, "lost")
    crash, lost = report.failures
    assert (crash.kind, crash.time_lost_s, crash.steps_lost, crash.detect_s) == (
        "exit",
        2.0,
        1,
        0.1,
    )
    assert (lost.kind, lost.time_lost_s, lost.steps_lost, lost.where) == (
        "lost_node",
        4.0,
        0,
        "the node on node 1 (b)",
    )
    assert a.replication == [(15.0, 20.0)]  # 10 MB of shards in 0.5 s
    # seconds per step over every node's generations: a 10 + 10 steps in 10.2 + 10.3 s
    # (generation 0, both nodes), 11 in 10.1 s, 10 in 10 s; 30 steps kept in 34 s
    assert report.final_step == 29
    assert report.step_s == pytest.approx(40.6 / 41)
    # 34 s of wall time less 2 + 4 s lost and one step done again
    assert report.goodput == pytest.approx((34 - 6 - 40.6 / 41) / 34)
    assert (crash.also, lost.also) == (0, 0)


def test_an_incident_is_its_generation_under_its_root_cause() -> None:
    """A lost node's peers die in their broken collective: one incident, the loss."""
    victim = "RuntimeError: Connection closed by peer [127.0.0.3]:1234"
    events = [
        ev(
            "generation_start",
            0,
            "a",
            gen=0,
            nodes=2,
            world_size=2,
            members=["a", "b"],
            restored_step=None,
        ),
        ev("fault", 11, "a", gen=0, **{**CRASH, "rank": 0, "fault_t": 10.5, "message": victim}),
        ev(
            "fault",
            12,
            "a",
            gen=0,
            **{
                **CRASH,
                "kind": "lost_node",
                "rank": None,
                "fault_node": 1,
                "host": "b",
                "fault_t": 10.0,
            },
        ),
        ev(
            "generation_start",
            14,
            "a",
            gen=1,
            nodes=1,
            world_size=1,
            members=["a"],
            restored_step=None,
        ),
    ]
    (incident,) = build_report(events).failures
    assert (incident.kind, incident.t, incident.time_lost_s, incident.also) == (
        "lost_node",
        10.0,
        4.0,
        1,
    )


def _start(t: float, agent: str, gen: int, restored: int | None = None):
    return ev(
        "generation_start",
        t,
        agent,
        gen=gen,
        nodes=2,
        world_size=4,
        members=["a", "b"],
        restored_step=restored,
    )


def _end(t: float, agent: str, gen: int, outcome: str, beats: tuple | None = None):
    """beats: (first step seen, when, newest step, when the beats last moved)."""
    first, first_t, reached, last_t = beats or (None, None, None, None)
    return ev(
        "generation_end",
        t,
        agent,
        gen=gen,
        outcome=outcome,
        seconds=1.0,
        last_step=None,
        reached_step=reached,
        first_seen_step=first,
        first_seen_t=first_t,
        last_beat_t=last_t,
    )


def _recovery(t: float, agent: str, gen: int, at_step: int | None, first: int | None):
    return ev(
        "recovery",
        t,
        agent,
        gen=gen,
        from_generation=gen - 1,
        cause="local_failure",
        down_s=1.0,
        lost_steps=0,
        at_step=at_step,
        first_step=first,
    )


def _redone_after_a_crash(kind: str = "exit", fault_t: float = 1005.1) -> list:
    """A script that beats once a step (0.1 s), resumes at step 10 from a checkpoint of
    its own after a crash at step 41 (steps 10..40 done again: 31), with no snapshot."""
    fault = {**CRASH, "kind": kind, "fault_t": fault_t}
    return [
        _start(1000, "a", 0),
        _start(1000, "b", 0),
        ev("fault", 1005.2, "a", gen=0, **fault),
        _end(1005.3, "a", 0, "local_failure", (1, 1001.0, 40, 1004.9)),
        _end(1005.3, "b", 0, "membership_change", (1, 1001.0, 41, 1005.0)),
        _start(1006, "a", 1),
        _start(1006, "b", 1),
        # first step seen at 11, its first beat was step 10 (0.1 s before)
        _recovery(1007.0, "a", 1, 11, 10),
        _recovery(1007.1, "b", 1, 11, 10),
        _end(1012.1, "a", 1, "succeeded", (11, 1007.0, 59, 1011.8)),
        _end(1012.1, "b", 1, "succeeded", (11, 1007.1, 59, 1011.9)),
        ev("job_end", 1012.2, "a", gen=1, exit_code=0, message="all workers succeeded"),
        ev("job_end", 1012.2, "b", gen=1, exit_code=0, message="all workers succeeded"),
    ]


def test_steps_done_again_come_from_the_heartbeats() -> None:
    report = build_report(_redone_after_a_crash())
    (crash,) = report.failures
    # it said 'steps lost 0': the step reached before (the slowest node's 40) against the
    # first one after (10)
    assert crash.steps_lost == 31 and crash.exact
    # 39 + 40 steps in 3.9 + 4.0 s, then 48 + 48 in 4.8 + 4.8 s
    assert report.step_s == pytest.approx(0.1)
    # down: from the fault to the first step after it, the last node's (seen at 11,
    # one step after its first)
    assert crash.time_lost_s == pytest.approx(1007.1 - 0.1 - 1005.1)
    assert report.final_step == 59 and report.ended == "succeeded (exit 0 on every node)"
    # the start-up: from the first event to the first step (step 1 seen at 1001, one
    # step after the first)
    assert report.startup_s == pytest.approx(0.9)
    lost = report.startup_s + crash.time_lost_s + 31 * report.step_s
    assert report.goodput == pytest.approx((report.wall_s - lost) / report.wall_s)
    assert not report.goodput_bound


def test_a_hang_costs_the_time_from_its_last_heartbeat() -> None:
    # the hang's record time is when its worker went silent (1002), detected 3 s later
    report = build_report(_redone_after_a_crash("hang", fault_t=1002.0))
    (hang,) = report.failures
    assert hang.time_lost_s == pytest.approx(1007.1 - 0.1 - 1002.0)


def test_what_rtrain_cannot_know_is_unknown_and_the_goodput_an_upper_bound() -> None:
    events = [
        e
        for e in _redone_after_a_crash()
        if e.name not in ("generation_end", "recovery") or e.generation == 1
    ]
    events = [  # no heartbeats at all: nothing says which steps were done again
        e if e.name != "generation_end" else _end(e.t, e.agent, 1, "succeeded") for e in events
    ]
    report = build_report(events)
    (crash,) = report.failures
    assert crash.steps_lost is None and not crash.exact  # it said 0
    assert crash.time_lost_s == pytest.approx(0.9)  # to the next start: a lower bound
    assert report.goodput_bound and report.final_step is None and report.step_s is None


def test_an_unfinished_job_says_how_it_ended_and_costs_its_tail() -> None:
    events = [
        _start(1000, "a", 0),
        _start(1000, "b", 0),
        _end(1010.0, "a", 0, "local_failure", (0, 1001.0, 50, 1005.0)),
        _end(1010.0, "b", 0, "local_failure", (0, 1001.0, 50, 1005.0)),
        # the store went away at 1005: both agents waited, then exited 75
        ev("job_end", 1030.0, "a", gen=0, exit_code=75, message="store gone"),
        ev("job_end", 1030.0, "b", gen=0, exit_code=75, message="store gone"),
    ]
    report = build_report(events)
    (tail,) = report.failures  # it said '0.00 s lost' and 'goodput 100.0%'
    assert report.ended == "unfinished: exit 75 on every node (store gone)"
    assert tail.kind == "unfinished: exit 75 on every node" and tail.time_lost_s == 25.0
    # 1 s starting up: its first step was seen at 1001
    assert report.wall_s == 30.0 and report.goodput == pytest.approx(4 / 30)


def test_the_report_fits_80_columns_without_cutting_a_cell(monkeypatch, capsys) -> None:
    from rtrain.cli.render.report import print_report

    monkeypatch.setenv("COLUMNS", "80")
    print_report(build_report(_redone_after_a_crash()))
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    assert "│ 31 " in out
    print_report(build_report(_redone_after_a_crash()), wide=True)
    wide = capsys.readouterr().out
    assert "rank 1 on node 0 (10.0.0.1)" in wide
