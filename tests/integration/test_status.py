"""`rtrain status` against a live 2-node job (read-only: the store holds the same keys
before and after, the job trains on to the end), through a whole 3-node job with a
restart and a lost node (every open round read many times, no agent disturbed), and its
one-line errors: no such job, garbage under the job's keys, no store, bad flags."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rtrain.agent.observe.status_reader import read_status
from rtrain.agent.store.opening import connect_store, host_store
from rtrain.agent.store.torch_store import TorchKeyValueStore
from rtrain.cli.status import open_reader_store, rdzv_spec
from rtrain.core.errors import RtrainError
from rtrain.core.rendezvous.protocol import StoreKeys
from tests.integration.cluster import STEPS, LocalCluster, assert_same_weights, final_records
from tests.integration.helpers import HeldPort, error_lines

pytestmark = pytest.mark.integration

STATUS = [sys.executable, "-m", "rtrain.cli.main", "status"]
FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=3"]


def status(endpoint: str, run_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [*STATUS, f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_status_of_a_live_job_shows_it_and_leaves_it_alone(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path,
        2,
        "2",
        ["--nproc-per-node=2", *FAST],
        PROBE_STEPS="150",
        PROBE_STEP_SLEEP="0.05",
    )
    endpoint, keys = f"127.0.0.1:{cluster.port}", StoreKeys(cluster.run_id)
    try:
        cluster.wait_progress(5)
        raw = connect_store("127.0.0.1", cluster.port, 10, 10).store
        records = [keys.status(0, 0), keys.status(0, 1)]
        deadline = time.monotonic() + 30  # each agent writes one as its generation starts
        while not raw.check(records):
            assert time.monotonic() < deadline, cluster.log(0)
            time.sleep(0.1)
        # The record written as the generation starts has no steps yet (no heartbeat: not
        # step 0); the next, a status period later, has every rank's.
        while not all(isinstance(s, int) for n in _view(endpoint, cluster) for s in n["steps"]):
            assert time.monotonic() < deadline, cluster.log(0)
            time.sleep(0.5)
        before = raw.num_keys()
        shown = status(endpoint, cluster.run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        view = json.loads(shown.stdout)
        assert (view["generation"], view["running"], view["failures"]) == (0, True, [])
        assert [n["ranks"] for n in view["nodes"]] == [[0, 1], [2, 3]]
        assert [n["addr"] for n in view["nodes"]] == ["127.0.0.1", "127.0.0.2"]
        assert all(n["problem"] is None and n["age_s"] < 15 for n in view["nodes"])
        assert all(isinstance(s, int) for n in view["nodes"] for s in n["steps"])
        assert view["store_reads"] <= 12
        table = status(endpoint, cluster.run_id)
        assert table.returncode == 0, table.stderr
        assert "generation 0 running on 2 node(s)" in table.stdout
        assert raw.num_keys() == before  # the two requests wrote nothing

        # Garbage under node 1's record, planted while its agent is stopped (so that it
        # cannot rewrite it first): that node is refused, the other shown.
        cluster.stop_agent(1)
        try:
            raw.set(keys.status(0, 1), "{garbage")
            planted = read_status(TorchKeyValueStore(raw, endpoint, 5.0), cluster.run_id)
        finally:
            cluster.cont_agent(1)
        assert planted.nodes[0].seen
        assert planted.nodes[1].problem == "refused: status record: not JSON"
        codes = cluster.wait()
    finally:
        cluster.close()
    assert codes == [0, 0], cluster.log(0) + cluster.log(1)
    assert cluster.progress() == 150


def _view(endpoint: str, cluster: LocalCluster) -> list[dict]:
    """The nodes `rtrain status --json` shows now (it reads, and writes nothing)."""
    shown = status(endpoint, cluster.run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["nodes"]


def test_status_errors_are_one_line_with_their_exit_code() -> None:
    with HeldPort() as held:  # nothing listens there: connections are refused
        unreachable = status(f"127.0.0.1:{held.port}", "job", "--timeout=1")
    assert unreachable.returncode == 75, unreachable.stderr
    assert len(error_lines(unreachable.stderr)) == 1, unreachable.stderr
    assert "Traceback" not in unreachable.stderr

    hosted = host_store("127.0.0.1", 0, 10)
    endpoint = f"127.0.0.1:{hosted.port}"
    absent = status(endpoint, "job")
    assert absent.returncode == 1 and error_lines(absent.stderr) == [
        "rtrain: error: no job 'job' in this store (nothing under /rtrain/job/)"
    ], absent.stderr
    hosted.store.set(StoreKeys("job").round, "soon")
    garbage = status(endpoint, "job", "--json")
    assert garbage.returncode == 1 and garbage.stdout == ""
    assert error_lines(garbage.stderr) == [
        "rtrain: error: refusing what is under /rtrain/job/round: "
        "round counter: expected an integer, got 'soon'"
    ], garbage.stderr

    for flags in (["--rdzv-backend=zk"], ["--timeout=-1"], ["--watch", "--interval=0"]):
        bad = status(endpoint, "job", *flags)
        assert bad.returncode == 64 and len(error_lines(bad.stderr)) == 1, (flags, bad.stderr)
    missing = subprocess.run([*STATUS, f"--rdzv-endpoint={endpoint}"], capture_output=True)
    assert missing.returncode == 64


class StatusLoop:
    """`rtrain status --json` run again and again, and the reader it uses read in a tight
    loop beside it (so that every open round is read, short ones too): what each saw."""

    def __init__(self, endpoint: str, run_id: str) -> None:
        self.endpoint, self.run_id = endpoint, run_id
        self.stop = threading.Event()
        self.commands: list[tuple[int, dict | None]] = []  # exit code, the view
        self.open_rounds: set[int] = set()  # rounds read while forming, with a joiner
        self.reads = 0
        self.threads = [threading.Thread(target=t, daemon=True) for t in (self._cli, self._tight)]
        for thread in self.threads:
            thread.start()

    def _cli(self) -> None:
        while True:  # a pause between commands: each costs a core for a moment
            done = status(self.endpoint, self.run_id, "--json", "--timeout=5")
            view = json.loads(done.stdout) if done.returncode == 0 else None
            self.commands.append((done.returncode, view))
            if self.stop.wait(0.3):
                return

    def _tight(self) -> None:
        store = None
        while not self.stop.wait(0.02):
            try:
                if store is None:
                    spec = rdzv_spec("c10d", self.endpoint, self.run_id, "", 5.0)
                    store = open_reader_store(spec)
                view = read_status(store, self.run_id)
            except RtrainError:  # no job yet, or its store gone at the end
                store = None
                continue
            self.reads += 1
            if not view.running and view.joined > 0:
                self.open_rounds.add(view.round)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)


def test_status_in_a_loop_through_a_job_with_faults_disturbs_nothing(
    tmp_path: Path, reference: list[float]
) -> None:
    """Issue 32: one `rtrain status` in an open round (the first rendezvous, a restart,
    the survivors waiting out a lost node) made every waiting agent exit 75 with
    "generation N has no membership in the store". Status runs in a loop from before the
    first agent starts to the end of a 3-node job whose rank 0 fails once (a restart)
    and whose node 2 is then killed (a lost node): the survivors finish, with the weights
    of the run that lost nothing."""
    flags = ["--nproc-per-node=1", "--max-restarts=3", *FAST]
    steps = STEPS
    cluster = LocalCluster(
        tmp_path,
        0,
        "2:3",
        flags,
        PROBE_STEPS=steps,
        PROBE_STEP_SLEEP="0.05",
        PROBE_FAULT="rank=0,step=8,gen=0,action=exit",
    )
    endpoint = f"127.0.0.1:{cluster.port}"
    loop = StatusLoop(endpoint, cluster.run_id)
    try:
        cluster.start_node(0, "2:3", flags)
        # node 0 alone in round 0, read by both loops before the others start
        deadline = time.monotonic() + 60
        while 0 not in loop.open_rounds or not any(
            view and not view["running"] and view["joined"] for _, view in loop.commands
        ):
            assert time.monotonic() < deadline and cluster.procs[0].poll() is None, cluster.log(0)
            time.sleep(0.05)
        cluster.start_node(1, "2:3", flags)
        cluster.start_node(2, "2:3", flags)
        cluster.wait_progress(20)  # past the restart
        cluster.kill_node(2)
        codes = cluster.wait(timeout=120)
    finally:
        loop.close()
        cluster.close()
    assert codes[:2] == [0, 0], cluster.log(0) + cluster.log(1)
    final = final_records(cluster)
    assert sorted(final) == [0, 1]
    assert all(rec["world_size"] == 2 and rec["applied"] == int(steps) for rec in final.values())
    for rec in final.values():
        assert_same_weights(rec["weights"], reference)
    # read in the first round, the restart's and the lost node's (at least three rounds)
    assert 0 in loop.open_rounds and len(loop.open_rounds) >= 3, loop.open_rounds
    # every command that found the job answered 0 (before it: no job yet, exit 1)
    answered = [code for code, _ in loop.commands]
    assert set(answered) <= {0, 1, 75} and answered.count(0) >= 3, answered
