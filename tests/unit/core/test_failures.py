"""Failure records: the one-line summary and the report's order."""

from __future__ import annotations

from rtrain.core.rendezvous.failures import FailureRecord, failure_roles, root_cause_first


def _record(
    kind: str, time: float, rank: int, exitcode: int | None, message: str = ""
) -> FailureRecord:
    return FailureRecord(kind, 0, 0, "h", time, rank, rank, 100 + rank, exitcode, message)  # type: ignore[arg-type]


def test_an_exit_without_a_python_exception_names_its_code() -> None:
    assert _record("exit", 1, 1, 3).summary() == (
        "exit 3: no Python exception (sys.exit(3) or os._exit(3))"
    )
    assert _record("signal", 1, 1, -9).summary() == "killed by SIGKILL"
    assert _record("exit", 1, 1, 1, "RuntimeError: boom").summary() == "RuntimeError: boom"
    assert _record("stopped", 1, 0, -15).summary() == (
        "stopped by rtrain after the failure above (SIGTERM)"
    )
    assert _record("lost_node", 1, 0, None).summary() == "lost node"


def test_stopped_workers_come_after_every_failure_even_a_victims() -> None:
    stopped = _record("stopped", 1.0, 0, -15)
    victim = _record("exit", 2.0, 2, 1, "RuntimeError: Connection reset by peer")
    root = _record("exit", 3.0, 1, 3)
    assert root_cause_first([stopped, victim, root]) == [root, victim, stopped]


def test_a_stopped_record_survives_encoding() -> None:
    record = _record("stopped", 1.0, 0, -15)
    assert FailureRecord.decode(record.encode()) == record


def test_a_hung_rank_that_stopped_is_the_root_cause_the_blocked_ranks_its_victims() -> None:
    """Node 0's healthy rank, found hung first (waiting in the collective), and a rank
    exiting after gloo's error are victims of the rank whose process stopped, later."""
    waiting = _record(
        "hang",
        1.0,
        0,
        -9,
        "hung: no heartbeat for 2.0s (waiting in a collective: likely a victim of another rank)",
    )
    exiting = _record(
        "hang",
        1.5,
        2,
        -9,
        "hung: no heartbeat for 2.1s (exiting after a collective error, "
        "likely a victim of another rank: RuntimeError: timed out)",
    )
    gloo = _record("exit", 1.2, 3, 1, "RuntimeError: [../gloo/transport/tcp/pair.cc] Timed out")
    stopped = _record("hang", 2.0, 1, -9, "hung: no heartbeat for 2.2s (process stopped)")
    later = _record("stopped", 0.5, 4, -15)
    records = [waiting, exiting, gloo, stopped, later]
    assert root_cause_first(records)[0] is stopped
    assert failure_roles(records) == ["victim", "victim", "victim", "root cause", ""]
