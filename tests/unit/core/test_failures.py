"""Failure records: the one-line summary and the report's order."""

from __future__ import annotations

from rtrain.core.rendezvous.failures import FailureRecord, root_cause_first


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
