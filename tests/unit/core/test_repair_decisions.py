"""Repair in place, decided (core/repair/decisions.py): every branch from views of
workers and the seconds given, no process, no file, no clock."""

from __future__ import annotations

import psutil

from rtrain.core.contract.repair_files import PARKED, RUNNING, STUCK
from rtrain.core.repair.decisions import (
    HELD,
    Ask,
    Replaced,
    Skip,
    WorkerView,
    answers_in,
    repair_outcome,
    resumes,
    spares_victim,
    start_repair,
)

GEN = 3


def view(local: int, said: str | None = RUNNING, **changes: object) -> WorkerView:
    """Local rank `local` (global rank 10 + local, pid 100 + local), running, having
    said `said` in this generation as itself."""
    fields: dict[str, object] = {
        "local_rank": local,
        "rank": 10 + local,
        "pid": 100 + local,
        "exited": False,
        "said": said,
        "said_generation": GEN,
        "said_pid": 100 + local,
    }
    fields.update(changes)
    return WorkerView(**fields)  # type: ignore[arg-type]


def test_the_held_states_are_psutils() -> None:
    assert {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE} == HELD


def test_a_crash_asks_the_survivors_and_forks_the_crashed_ranks_replacement() -> None:
    workers = [view(0), view(1, exited=True), view(2)]
    assert start_repair(workers, GEN, gpu_fault=False, job_repairs=True) == Ask((0, 2), (1,))


def test_workers_that_all_failed_still_count_as_opted_in() -> None:
    workers = [view(0, exited=True), view(1, exited=True)]
    assert start_repair(workers, GEN, False, True) == Ask((), (0, 1))


def test_no_repair_without_opting_in_in_this_generation_as_this_process() -> None:
    assert start_repair([view(0, said=None)], GEN, False, True) is Skip.NOT_OPTED_IN
    old = view(0, said_generation=GEN - 1)  # said it in an earlier generation
    assert start_repair([old], GEN, False, True) is Skip.NOT_OPTED_IN
    other = view(0, said_pid=999)  # a file its predecessor left
    assert start_repair([other], GEN, False, True) is Skip.NOT_OPTED_IN
    # a running worker that did not opt in decides, not an exited one that did
    assert start_repair([view(0, said=None), view(1, exited=True)], GEN, False, True) is (
        Skip.NOT_OPTED_IN
    )


def test_a_gpu_fault_a_fallback_and_the_jobs_end_never_park() -> None:
    workers = [view(0), view(1, exited=True)]
    assert start_repair(workers, GEN, gpu_fault=True, job_repairs=True) is Skip.GPU_FAULT
    assert start_repair(workers, GEN, False, job_repairs=False) is Skip.JOB_FALLBACK
    assert start_repair(workers, GEN, False, True, restarts_left=False) is Skip.JOB_ENDING


def test_the_wait_ends_when_every_asked_worker_settled_or_time_is_up() -> None:
    asked = [view(0, said=PARKED), view(1)]
    assert not answers_in(asked, waited_s=0.1, ack_s=5.0)  # rank 1 may still answer
    assert answers_in(asked, waited_s=5.0, ack_s=5.0)  # a survivor that never answers
    assert answers_in([view(0, said=PARKED), view(1, said=STUCK)], 0.1, 5.0)
    assert answers_in([view(0, said=PARKED), view(1, exited=True)], 0.1, 5.0)  # 2nd fault


def test_a_held_survivor_is_replaced_at_once_not_after_the_wait() -> None:
    for process in ("stopped", "tracing-stop", "zombie", None):
        asked = [view(0, said=PARKED), view(1, process=process)]
        assert answers_in(asked, waited_s=0.0, ack_s=5.0), process


def test_the_outcome_keeps_the_parked_and_replaces_each_other_for_its_reason() -> None:
    workers = [
        view(0, said=PARKED),
        view(1, exited=True),  # a second fault while parking
        view(2, said=STUCK),  # a stuck release
        view(3),  # never answered
        view(4, said=PARKED, process="stopped"),  # parked, then stopped
        view(5, said=None),  # running, never opted in: not asked
    ]
    outcome = repair_outcome(workers, asked=(0, 2, 3, 4))
    assert outcome.kept == {0: 100} and outcome.kept_ranks == {0: 10}
    assert outcome.replaced == {
        2: Replaced.STUCK,
        3: Replaced.SILENT,
        4: Replaced.HELD,
        5: Replaced.NOT_ASKED,
    }
    assert outcome.failed
    assert outcome.ranks(workers) == [11, 12, 13, 14, 15]


def test_a_repair_fails_only_when_something_asked_was_not_kept() -> None:
    clean = repair_outcome([view(0, said=PARKED), view(1, exited=True)], asked=(0,))
    assert not clean.failed and clean.kept == {0: 100} and not clean.replaced
    assert repair_outcome([view(0, exited=True)], asked=()).failed is False  # asked none
    # asked, and nothing kept: the one asked exited while parking
    assert repair_outcome([view(0, exited=True)], asked=(0,)).failed


def test_a_parked_answer_counts_only_from_the_process_itself() -> None:
    outcome = repair_outcome([view(0, said=PARKED, said_pid=555)], asked=(0,))
    assert outcome.replaced == {0: Replaced.SILENT} and not outcome.kept


def test_a_kept_worker_resumes_only_alive_and_unheld() -> None:
    assert resumes(100, "sleeping") and resumes(100, "running")
    for process in ("stopped", "tracing-stop", "zombie", None):
        assert not resumes(100, process)
    assert not resumes(None, "running")  # nothing was kept for it


def test_a_silent_victim_is_spared_for_a_bounded_time_only() -> None:
    assert spares_victim(True, True, held=False, silent_s=5.0, hang_s=4.0, spare_for=2.0)
    assert not spares_victim(True, True, False, silent_s=8.0, hang_s=4.0, spare_for=2.0)
    assert not spares_victim(True, True, held=True, silent_s=1.0, hang_s=4.0, spare_for=2.0)
    assert not spares_victim(True, False, False, 1.0, 4.0, 2.0)  # not opted in
    assert not spares_victim(False, True, False, 1.0, 4.0, 2.0)  # the job fell back
