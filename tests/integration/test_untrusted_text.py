"""Text from outside rtrain (a worker's error, a store's record, an events file, a GPU's
name) through every command that shows it: rich markup ([/bold]) prints as itself (it
raised MarkupError, a traceback, in `rtrain status`), control characters are shown
escaped and never reach the terminal, a very long line and undecodable bytes are no
traceback (issue 31 item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rtrain.agent.rendezvous.ledger import FailureLedger
from rtrain.agent.store.opening import host_store
from rtrain.agent.store.torch_store import TorchKeyValueStore
from rtrain.core.observe.events import EVENTS_FILE, event_line
from rtrain.core.observe.status import NodeStatus
from rtrain.core.rendezvous.failures import FailureKind, FailureRecord
from rtrain.core.rendezvous.protocol import MemberInfo, Membership, StoreKeys
from tests.integration.helpers import ROOT, RTRAIN, probe_env, run

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "rtrain.cli.main"]
# markup that does not balance, ANSI colour and clear-screen, an OSC title with BEL, a
# carriage return that would overwrite the line, and a bidi override
NASTY = "bad [/bold] [red]x[/] \x1b[31mred\x1b[0m \x1b[2J \x1b]0;owned\x07 \rover \u202eevil"
LONG = "y" * 5000
ENV = {"PATH": "/usr/bin:/bin", "COLUMNS": "80", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def assert_shown_safely(done, *fragments: str, traceback: bool = False) -> None:
    """traceback: the output shows a worker's (the failure report does)."""
    both = done.stdout + done.stderr
    assert traceback or "Traceback" not in both, both[-3000:]
    assert "MarkupError" not in both and "rich/" not in both, both[-3000:]
    assert "\x1b" not in both and "\x07" not in both and "\r" not in both and "\u202e" not in both
    assert "[/bold]" in both and "\\x1b[31m" in both, both[-3000:]
    for fragment in fragments:
        assert fragment in both, (fragment, both[-3000:])


def test_status_shows_a_failure_holding_markup_and_escapes() -> None:
    hosted = host_store("127.0.0.1", 0, 10)
    store = TorchKeyValueStore(hosted.store, "127.0.0.1", 10)
    keys = StoreKeys("job")
    store.set(keys.round, "1")
    members = [MemberInfo("n0", "10.0.0.1", 1), MemberInfo(f"n1{NASTY}", f"10.0.0.2{NASTY}", 1)]
    store.set(keys.closed(1), Membership(1, members).encode())
    store.set(keys.status(1, 0), NodeStatus(1000.0, "running", (0,), (7,), None, None).encode())
    ledger = FailureLedger(store, keys, 0)
    for message in (NASTY, NASTY + LONG, "\udcff\udcfe undecodable"):
        host = f"host{NASTY}"
        ledger.record_failure(FailureRecord(FailureKind.EXIT, 0, 1, host, 900.0, message=message))
    done = run([*CLI, "status", f"--rdzv-endpoint=127.0.0.1:{hosted.port}", "--rdzv-id=job"], ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_shown_safely(done, "\\udcff", "\\u202eevil")


def test_report_of_events_holding_markup_escapes_and_bad_bytes(tmp_path: Path) -> None:
    lines = [
        event_line("generation_start", 100.0, "n0", 0, 0, _start(None)),
        event_line(
            "fault",
            101.0,
            "n0",
            0,
            0,
            {
                "kind": "exit",
                "rank": 0,
                "fault_node": 0,
                "host": f"h{NASTY}{LONG}",
                "fault_t": 101.0,
                "message": NASTY,
            },
        ),
        event_line("generation_end", 101.5, "n0", 0, 0, _end("local_failure")),
        event_line("generation_start", 102.0, f"n0{NASTY}$x^2$", 0, 1, _start(None)),
        event_line("generation_end", 103.0, f"n0{NASTY}$x^2$", 0, 1, _end("succeeded")),
    ]
    raw = "".join(lines).encode() + b'{"v": 1, "event": "fault", "host": "\xff\xfe"}\n'
    (tmp_path / EVENTS_FILE).write_bytes(raw)
    done = run([*CLI, "report", str(tmp_path)], ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_shown_safely(done, "1 line(s) were not rtrain events")


def _start(restored: int | None) -> dict:
    return {"nodes": 1, "world_size": 1, "members": ["n0"], "restored_step": restored}


def _end(outcome: str) -> dict:
    return {"outcome": outcome, "seconds": 1.0, "last_step": None, "reached_step": None}


def test_launch_failure_table_shows_a_worker_error_as_text(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(f"raise RuntimeError({NASTY + LONG!r})\n")
    args = ["--nproc-per-node=1", "--max-restarts=0", "--standalone", str(script)]
    done = run([*RTRAIN, *args], {**probe_env(tmp_path), "COLUMNS": "80"}, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    # the worker's own stderr goes through as it wrote it (as under torchrun); what
    # rtrain shows of it, from the failure table on, is escaped
    start = done.stderr.index("FAILED")
    shown = subprocess.CompletedProcess(done.args, 1, "", done.stderr[start:])
    assert_shown_safely(shown, "RuntimeError", "more characters", traceback=True)
    # the reason ends rtrain's report of the failure; only the hint of what would have
    # kept the job going (rtrain's own text) follows it
    hint = shown.stderr.rindex("rtrain: to keep such a job going")
    assert shown.stderr[:hint].rstrip().endswith("max_restarts=0 exhausted")


def test_plan_and_health_show_user_files_as_text(tmp_path: Path) -> None:
    profile = tmp_path / "p[red]x[b].json"
    profile.write_text(json.dumps({"forward": f"{NASTY}"}))
    done = run([*CLI, "plan", "--dp=2", "--pp=2", "--microbatches=2", f"--profile={profile}"], ENV)
    assert done.returncode == 64, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "\x1b" not in done.stdout + done.stderr
    scenario = tmp_path / "gpus.json"
    gpu = {"name": f"GPU {NASTY}{LONG}", "uuid": f"GPU-[/]{NASTY}", "readings": {}}
    scenario.write_text(json.dumps({"gpus": [gpu, {**gpu, "uuid": "GPU-2"}]}))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_VIS"))}
    environ.pop("RTRAIN_FAKE_NVML", None)
    done = run([*CLI, "health", "--fake-nvml", str(scenario)], {**environ, "COLUMNS": "80"})
    assert done.returncode in (0, 1, 2, 3), done.stdout + done.stderr
    assert_shown_safely(done, "GPU health")
    assert ROOT.exists()


def test_error_lines_show_a_user_value_escaped(tmp_path: Path) -> None:
    missing = tmp_path / "logs\x1b[2J\x07"
    done = run([*CLI, "report", str(missing)], ENV)
    assert done.returncode == 64 and "\\x1b[2J\\x07: not a folder" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
