"""A worker forked from rtrain's pool gets what torchrun's fresh interpreter gets from the
scheduler: nice, policy and CPU affinity on every thread (gloo's included), the session's
autogroup nice, timer slack, resource limits, torch's thread counts and the thread-count
variables. rtrain's pool runs an idle-priority (SCHED_IDLE) warm-up thread, and a fork
takes the forking thread's policy, nice and timer slack: a worker that inherited any of
it would be slower than under torchrun on a busy node. torchrun is the oracle.

The probe reads them after init_process_group and three all_reduces, so gloo's threads
exist (tests/clients/scripts/sched_probe.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.clients.clients import LAUNCH, SCRIPTS
from tests.integration.helpers import RTRAIN, probe_env, run, run_torchrun

pytestmark = [pytest.mark.integration, pytest.mark.clients]

PROBE = str(SCRIPTS / "sched_probe.py")


def probe(launcher: str, out: Path, *flags: str) -> dict[int, dict[str, Any]]:
    out.mkdir(parents=True)
    args = [*LAUNCH, *flags, PROBE, "--out", str(out)]
    if launcher == "torchrun":
        result = run_torchrun(args, probe_env(out), timeout=120)
    else:
        result = run([*RTRAIN, *args], probe_env(out), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return {rank: json.loads((out / f"sched_rank{rank}.json").read_text()) for rank in (0, 1)}


def test_a_forked_worker_is_scheduled_as_under_torchrun(tmp_path: Path) -> None:
    theirs = probe("torchrun", tmp_path / "torchrun")
    ours = probe("rtrain", tmp_path / "rtrain")
    for rank in (0, 1):
        assert ours[rank] == theirs[rank], rank
        # and what that means: every thread of a worker at the launcher's own priority
        # (this test's), none at idle priority
        mine = (os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0))
        for thread in ours[rank]["threads"]:
            assert (thread["nice"], thread["policy"]) == mine, thread


def test_thread_counts_a_script_sets_before_importing_torch_are_torchruns(
    tmp_path: Path,
) -> None:
    # The pool imported torch under OMP_NUM_THREADS=1 (two workers, as torchrun sets);
    # a script that sets 2 itself before its import gets 2 under torchrun, and so under
    # rtrain (started as a fresh interpreter, decided from the script's source; forked
    # from the pool it had 1).
    found = {}
    for launcher in ("torchrun", "rtrain"):
        out = tmp_path / launcher
        out.mkdir()
        args = [*LAUNCH, str(SCRIPTS / "threads_probe.py"), "--out", str(out)]
        if launcher == "torchrun":
            result = run_torchrun(args, probe_env(out), timeout=120)
        else:
            result = run([*RTRAIN, *args], probe_env(out), timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        found[launcher] = [json.loads((out / f"threads_rank{r}.json").read_text()) for r in (0, 1)]
    assert found["rtrain"] == found["torchrun"] == [{"intra": 2, "inter": 2}] * 2
