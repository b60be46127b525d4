"""The repair control files (core/contract/repair_files.py): what one side writes the
other reads back; anything else (garbage, wrong types, oversized) is refused as None."""

from __future__ import annotations

import json

from rtrain.core.contract.repair_files import (
    MAX_BYTES,
    PARKED,
    RUNNING,
    Resume,
    WorkerState,
    decode_request,
    decode_resume,
    decode_state,
    encode_request,
    encode_resume,
    encode_state,
)


def test_each_file_reads_back_what_was_written() -> None:
    for state in (WorkerState(RUNNING, 0, 12), WorkerState(PARKED, 7, 99)):
        assert decode_state(encode_state(state)) == state
    assert decode_request(encode_request(3)) == 3
    resume = Resume(4, 321, {"RANK": "1", "MASTER_PORT": "29500"})
    assert decode_resume(encode_resume(resume)) == resume
    # a hand-over names its process: one without a pid is not a hand-over
    assert decode_resume(b'{"generation": 4, "env": {}}') is None


def test_anything_else_is_refused() -> None:
    bad = [
        None,
        b"",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"state": "running", "generation": "0", "pid": 1}',
        b'{"state": "dancing", "generation": 0, "pid": 1}',
        b'{"state": "parked", "generation": true, "pid": 1}',
    ]
    assert all(decode_state(data) is None for data in bad)
    assert decode_request(b'{"generation": 1.5}') is None
    assert decode_resume(b'{"generation": 1, "env": {"RANK": 1}}') is None
    assert decode_resume(b'{"generation": 1, "env": ["RANK"]}') is None
    huge = json.dumps({"generation": 1, "env": {"X": "a" * MAX_BYTES}}).encode()
    assert decode_resume(huge) is None
