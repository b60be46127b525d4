"""`rtrain report` and `rtrain status` show a repair in place (the `repair` event): what
was kept and what was restarted."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from rtrain.cli.render.report import print_report, summary
from rtrain.cli.render.status import status_view
from rtrain.core.observe.events import event_line, parse_event
from rtrain.core.observe.repairs import RepairNote, merge
from rtrain.core.observe.report import build_report
from rtrain.core.observe.status import JobStatus, NodeStatus, node_views
from rtrain.core.rendezvous.protocol import MemberInfo, Membership, ProtocolError

CRASH = {
    "kind": "signal",
    "rank": 1,
    "fault_node": 0,
    "host": "a",
    "fault_t": 1005.0,
    "message": "rank 1 was killed by SIGKILL",
}


def ev(name: str, t: float, agent: str, gen: int, **fields):
    event = parse_event(event_line(name, t, agent, 0 if agent == "a" else 1, gen, fields))
    assert event is not None
    return event


def _start(t: float, agent: str, gen: int):
    members = ["a", "b"]
    return ev(
        "generation_start", t, agent, gen, nodes=2, world_size=4, members=members, restored_step=4
    )


def _repair(t: float, agent: str, kept: list[int], restarted: list[int], fallback=()):
    fields = {"kept": kept, "restarted": restarted, "fallback": list(fallback)}
    return ev("repair", t, agent, 0, from_generation=0, seconds=0.4, **fields)


def _repaired_run(repairs: list) -> list:
    """2 nodes x 2 workers; rank 1 (node a) killed; node a keeps rank 0 and restarts 1,
    node b keeps ranks 2 and 3."""
    return [
        _start(1000, "a", 0),
        _start(1000, "b", 0),
        ev("fault", 1005.1, "a", 0, **CRASH),
        *repairs,
        _start(1006, "a", 1),
        _start(1006, "b", 1),
    ]


REPAIRS = [_repair(1005.5, "a", [0], [1]), _repair(1005.6, "b", [2, 3], [])]


def test_a_repaired_incident_says_what_was_kept_and_restarted() -> None:
    report = build_report(_repaired_run(REPAIRS))
    (incident,) = report.failures
    assert incident.repair == RepairNote(0, (0, 2, 3), (1,), (), 0.4)
    assert [len(n.repairs) for n in report.nodes] == [1, 1]
    assert report.nodes[0].repairs[0].t == pytest.approx(5.5)
    assert summary(report)[-1] == (
        "1 repair(s) in place: 3 worker process(es) kept across them instead of restarted"
    )


def test_the_report_table_marks_a_repair_and_a_restart(capsys) -> None:
    print_report(build_report(_repaired_run(REPAIRS)), wide=True)
    out = capsys.readouterr().out
    assert (
        "incident at 5.00 s (gen 0) repaired in place: kept ranks 0 2 3, restarted 1, "
        "parked in 0.40 s" in out
    )
    print_report(build_report(_repaired_run([])), wide=True)
    out = capsys.readouterr().out
    assert "repaired in place: " not in out and "repair(s)" not in out


def test_a_fallback_is_shown_and_a_garbled_repair_event_is_left_out(capsys) -> None:
    fallback = [_repair(1005.5, "a", [0], [1]), _repair(1005.6, "b", [3], [2], [2])]
    (incident,) = build_report(_repaired_run(fallback)).failures
    assert incident.repair is not None and incident.repair.describe() == (
        "kept ranks 0 3, restarted 1 2 (fallback: 2 did not park), parked in 0.40 s"
    )
    garbled = _repair(1005.5, "a", [0], [1])
    garbled.fields["kept"] = [-1]  # not a rank: not what rtrain writes
    (incident,) = build_report(_repaired_run([garbled])).failures
    assert incident.repair is None


def test_a_node_that_kept_none_adds_its_restarted_ranks_but_no_ring() -> None:
    # rank 1 (node a) killed; node b's workers both failed: b keeps none
    mixed = [_repair(1005.5, "a", [0], [1]), _repair(1005.6, "b", [], [2, 3])]
    report = build_report(_repaired_run(mixed))
    (incident,) = report.failures
    assert incident.repair == RepairNote(0, (0,), (1, 2, 3), (), 0.4)
    assert [len(n.repairs) for n in report.nodes] == [1, 0]  # b repaired nothing in place


def test_a_generation_in_which_no_node_kept_a_process_is_no_repair_in_place() -> None:
    none_kept = [_repair(1005.5, "a", [], [0, 1]), _repair(1005.6, "b", [], [2, 3], [2, 3])]
    report = build_report(_repaired_run(none_kept))
    (incident,) = report.failures
    assert incident.repair is None and report.repairs == {}
    assert [len(n.repairs) for n in report.nodes] == [0, 0]
    assert "repair(s)" not in summary(report)[-1]
    off = RepairNote(0, (), (2, 3), (2, 3), 5.0, job_fallback=True)  # said, as before
    assert merge([RepairNote(0, (), (0, 1), (), 0.1), off]) == {
        0: RepairNote(0, (), (0, 1, 2, 3), (2, 3), 5.0, True)
    }


MEMBERS = Membership(1, [MemberInfo("n0", "10.0.0.0", 2), MemberInfo("n1", "10.0.0.1", 2)])


def _record(repair: RepairNote | None, ranks: tuple[int, int]) -> bytes:
    return NodeStatus(100.0, "running", ranks, (7, 7), 6, 6, repair).encode().encode()


def test_status_records_carry_the_nodes_last_repair_and_the_view_shows_it() -> None:
    mine = RepairNote(0, (0,), (1,), (), 0.25)
    record = NodeStatus.decode(_record(mine, (0, 1)))
    assert record.repair == mine
    nodes = node_views(
        MEMBERS,
        [_record(mine, (0, 1)), _record(RepairNote(0, (2, 3), (), (), 0.5), (2, 3))],
        [],
        101,
    )
    view = JobStatus("job", 1, 1, True, 0, nodes, (), 0)
    assert view.last_repair == RepairNote(0, (0, 2, 3), (1,), (), 0.5)
    assert view.as_json()["last_repair"]["kept"] == [0, 2, 3]
    console = Console(width=200, record=True)
    console.print(status_view(view))
    assert (
        "last repair in place (after generation 0): kept ranks 0 2 3, restarted 1, "
        "parked in 0.50 s" in console.export_text()
    )
    plain = JobStatus("job", 1, 1, True, 0, node_views(MEMBERS, [None, None], [], 101), (), 0)
    console = Console(width=200, record=True)
    console.print(status_view(plain))
    assert plain.last_repair is None and "repair" not in console.export_text()


@pytest.mark.parametrize(
    "repair, fragment",
    [
        ("kept 0", "must be an object"),
        ({"from_generation": 0, "kept": [0], "restarted": [1], "fallback": []}, "seconds"),
        ({"from_generation": -1, "kept": [], "restarted": [], "fallback": [], "seconds": 0}, "gen"),
        (
            {"from_generation": 0, "kept": [True], "restarted": [], "fallback": [], "seconds": 0},
            "kept",
        ),
    ],
)
def test_a_repair_in_a_record_rtrain_did_not_write_is_refused(repair, fragment: str) -> None:
    data = {**json.loads(_record(None, (0, 1))), "repair": repair}
    with pytest.raises(ProtocolError, match=fragment):
        NodeStatus.decode(json.dumps(data))


def test_the_agents_status_record_carries_its_last_repair_event(tmp_path) -> None:
    from rtrain.agent.observe.events import emit
    from rtrain.agent.observe.observer import Observer
    from rtrain.core.config.component_specs import observe_part
    from rtrain.core.rendezvous.place import Place
    from rtrain.core.rendezvous.protocol import StoreKeys
    from tests.unit.agent.fakes import FakeClock, launch_spec, memory_store

    clock = FakeClock()
    spec = launch_spec("--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=x:1")
    observer = Observer(observe_part(spec), str(tmp_path), "10.0.0.1", 1, clock.clock)
    store, keys = memory_store(), StoreKeys(spec.rdzv.run_id)
    place = Place(MEMBERS, 0)
    try:
        emit("repair", from_generation=0, kept=[0], restarted=[1], fallback=[], seconds=0.25)
        observer.publish_status(store, keys, place, [], None, None)
    finally:
        observer.close()
    record = NodeStatus.decode(store.get(keys.status(1, 0)))
    assert record.repair == RepairNote(0, (0,), (1,), (), 0.25)


def test_the_repair_that_turned_repair_off_for_the_job_says_so() -> None:
    note = RepairNote.from_fields(
        {
            "from_generation": 4,
            "kept": [3],
            "restarted": [1, 2],
            "fallback": [2],
            "seconds": 5.1,
            "job_fallback": True,
        }
    )
    assert note.job_fallback
    assert note.describe().endswith("; repair in place off for the job from here (too many failed)")
    assert RepairNote.from_fields(note.as_json()) == note
    plain = RepairNote(4, (3,), (1,), (), 0.5)
    assert "job_fallback" not in plain.as_json()  # records as before when it is not
    with pytest.raises(ValueError):
        RepairNote.from_fields({**note.as_json(), "job_fallback": "yes"})


def test_a_rank_lost_after_it_parked_is_not_reported_as_kept() -> None:
    # node b kept ranks 2 and 3 at the park; rank 2 was stopped before the hand-over
    # (a repair_lost event): replaced, so the job's repair kept 0 and 3, restarted 1, 2
    a = RepairNote(0, (0,), (1,), (), 0.2)
    b = RepairNote(0, (2, 3), (), (), 0.3).lose(2)
    assert b.kept == (3,) and b.restarted == (2,) and b.lost == (2,)
    assert b.lose(9) is b  # not kept: nothing to amend
    assert RepairNote.from_fields(b.as_json()) == b
    (merged,) = merge([a, RepairNote(0, (2, 3), (), (), 0.3), b]).values()
    assert merged.kept == (0, 3) and merged.restarted == (1, 2) and merged.lost == (2,)
    assert "2 lost after parking" in merged.describe()


def test_the_report_takes_a_rank_lost_after_the_park_out_of_the_kept() -> None:
    events = [
        _start(1000.0, "a", 0),
        _start(1000.0, "b", 0),
        ev("fault", 1005.0, "a", 0, **CRASH),
        ev(
            "repair",
            1005.1,
            "a",
            0,
            from_generation=0,
            kept=[0],
            restarted=[1],
            fallback=[],
            seconds=0.1,
        ),
        ev(
            "repair",
            1005.2,
            "b",
            0,
            from_generation=0,
            kept=[2, 3],
            restarted=[],
            fallback=[],
            seconds=0.1,
        ),
        ev(
            "repair_lost",
            1005.3,
            "b",
            0,
            from_generation=0,
            rank=2,
            pid=77,
            why="stopped while parked",
        ),
    ]
    (note,) = build_report(events).repairs.values()
    assert note.kept == (0, 3) and note.restarted == (1, 2) and note.lost == (2,)
