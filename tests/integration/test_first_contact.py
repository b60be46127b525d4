"""What `rtrain launch` says first (issue 31, first contact): the run id, the store's
address, the log folder and the exact `rtrain status` command that reaches the job
(which the test then runs), no `node- gen-` placeholders, a line while a node waits for
its peers, and the snapshot-memory line only for a job that snapshots."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.cluster import RESUMABLE, SNAPSHOTTING, LocalCluster
from tests.integration.helpers import ROOT, RTRAIN, probe_env

pytestmark = pytest.mark.integration

STATUS_LINE = re.compile(
    r"run (\S+): rendezvous store (\S+) \((TCPStore, hosted here|TCPStore)\); "
    r"see the job with: (rtrain status .*)$"
)
FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=3"]


def _lines(stream: object, into: queue.Queue[str]) -> None:
    for text in stream:  # type: ignore[attr-defined]
        into.put(text.rstrip("\n"))
    into.put("")  # the end


def _status(command: str) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command)
    assert words[:2] == ["rtrain", "status"], command
    argv = [sys.executable, "-m", "rtrain.cli.main", *words[1:], "--json"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_a_standalone_launch_says_how_to_reach_it(tmp_path: Path) -> None:
    env = probe_env(tmp_path / "out", PROBE_STEPS="400", PROBE_STEP_SLEEP="0.02")
    env["PROBE_CKPT"] = str(tmp_path / "ckpt.pt")
    cmd = [*RTRAIN, "--standalone", "--nproc-per-node=1", RESUMABLE]
    launch = subprocess.Popen(
        cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(launch.stderr, lines), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        found = None
        while found is None:
            seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.1)))
            assert seen[-1] or launch.poll() is None, "\n".join(seen)
            found = STATUS_LINE.search(seen[-1])
        run_id, endpoint, kind, command = found.groups()
        assert endpoint.startswith("127.0.0.1:") and kind == "TCPStore, hosted here"
        assert command == f"rtrain status --rdzv-endpoint {endpoint} --rdzv-id {run_id}"
        shown = _status(command)  # the command as printed reaches the running job
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["run_id"] == run_id
        assert launch.wait(timeout=120) == 0
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    while (line := lines.get(timeout=10)) != "":
        seen.append(line)
    text = "\n".join(seen)
    [folder] = re.findall(rf"run {re.escape(run_id)}: logs in (\S+)$", text, re.M)
    assert os.path.isdir(folder) and os.path.basename(folder).startswith(run_id), text
    assert "node- " not in text and "gen- " not in text, text
    assert "snapshot memory" not in text, text  # this script never calls snapshot()


def test_a_node_says_whom_it_waits_for_and_a_snapshotting_job_its_memory(
    tmp_path: Path,
) -> None:
    flags = ["--nproc-per-node=1", *FAST]
    cluster = LocalCluster(tmp_path, 0, "2", flags, script=SNAPSHOTTING, PROBE_STEPS="10")
    try:
        cluster.start_node(0, "2", flags)
        deadline = time.monotonic() + 60
        waiting = re.compile(r"rendezvous: 1 of 2 nodes joined round 0 \((\d+)s so far\)")
        while not waiting.search(cluster.log(0)):
            assert time.monotonic() < deadline and cluster.procs[0].poll() is None, cluster.log(0)
            time.sleep(0.1)
        cluster.start_node(1, "2", flags)
        codes = cluster.wait(timeout=120)
    finally:
        cluster.close()
    logs = [cluster.log(0), cluster.log(1)]
    assert codes == [0, 0], "\n".join(logs)
    for index, log in enumerate(logs):
        found = [STATUS_LINE.search(line) for line in log.splitlines()]
        [line] = [m for m in found if m is not None]
        assert line.group(3) == ("TCPStore, hosted here" if index == 0 else "TCPStore")
        assert line.group(2) == f"127.0.0.1:{cluster.port}"
        assert "snapshot memory:" in log, log  # the script snapshots every step
