"""--log-format json: each of rtrain's log lines is one JSON object, its context (node,
generation) as fields; text stays the bracketed header."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from rtrain.agent.observe import log
from rtrain.cli.launch_args import parse_launch_args
from rtrain.core.config.launch_spec import build_launch_spec
from rtrain.core.errors import UsageError


@pytest.fixture
def context(monkeypatch: pytest.MonkeyPatch) -> log.LogContext:
    fresh = log.LogContext()
    monkeypatch.setattr(log, "CONTEXT", fresh)
    return fresh


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    made = logging.LogRecord("rtrain.agent", logging.WARNING, __file__, 1, message, args, info)
    made.created = 1_700_000_000.25
    return made


def test_a_json_line_carries_the_context_as_fields(context: log.LogContext) -> None:
    formatter = log.JsonFormatter()
    log.set_node("gpu-node-7")
    before = json.loads(formatter.format(record("joining %s", "10.0.0.1:29400")))
    assert before == {
        "time": "2023-11-14T22:13:20.250Z",
        "level": "WARNING",
        "logger": "rtrain.agent",
        "node": None,
        "generation": None,
        "message": "joining 10.0.0.1:29400",
        "host": "gpu-node-7",
    }
    log.set_node_rank(1)
    log.set_generation(3)
    line = formatter.format(record('a "quoted"\nsecond line', exc=True))
    assert "\n" not in line  # one line, whatever the message holds
    after = json.loads(line)
    assert (after["node"], after["generation"]) == (1, 3) and "host" not in after
    assert after["message"].startswith('a "quoted"\nsecond line\nTraceback')
    assert after["message"].endswith("ValueError: boom")


def test_the_flag_takes_text_or_json_only() -> None:
    assert build_launch_spec(parse_launch_args(["t.py"], {})) is not None
    assert parse_launch_args(["t.py"], {})["log_format"] == "text"
    assert parse_launch_args(["--log-format", "json", "t.py"], {})["log_format"] == "json"
    assert parse_launch_args(["t.py"], {"PET_LOG_FORMAT": "json"})["log_format"] == "json"
    with pytest.raises(UsageError, match="--log-format"):
        parse_launch_args(["--log-format", "xml", "t.py"], {})
    with pytest.raises(UsageError, match="--log-format"):
        build_launch_spec(parse_launch_args(["t.py"], {"PET_LOG_FORMAT": "xml"}))
