"""`rtrain status` against a live 2-node job (read-only: the store holds the same keys
before and after, the job trains on to the end), and its one-line errors: no such job,
garbage under the job's keys, no store, bad flags."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rtrain.agent.observe.status_reader import read_status
from rtrain.agent.store.opening import connect_store, host_store
from rtrain.agent.store.torch_store import TorchKeyValueStore
from rtrain.core.rendezvous.protocol import StoreKeys

from tests.integration.cluster import LocalCluster
from tests.integration.helpers import error_lines, free_port

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


def test_status_errors_are_one_line_with_their_exit_code() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    unreachable = status(nobody, "job", "--timeout=1")
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
