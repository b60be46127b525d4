"""The nodes' fault history and the state network probe, with real agents on localhost
nodes (issue: nodes that failed before; the right network for state).

Two active nodes (--nnodes 2:2) and two hot spares that join round 1 while they run:
node 2 first (slot 1), whose address the --checkpoint-dir history (an earlier job's)
charges 2 faults in the window, then node 3. Node 1 is SIGKILLed whole: its place goes
to node 3, not to the first spare, and the loss is added to the history file. At the
first generation each agent measured a transfer to its ring successor."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rtrain.agent.health.fault_history import read_history_file
from rtrain.core.rendezvous.fault_history import HISTORY_FILE, FaultEntry, encode_history
from tests.integration.cluster import LocalCluster

FLAGS = ["--nproc-per-node=1", "--max-restarts=3", "--heartbeat-interval=0.5"]
FLAGGED, SPARE, KILLED = "127.0.0.3", "127.0.0.4", "127.0.0.2"


def _wait_for(what: str, check: Callable[[], bool], cluster: LocalCluster) -> None:
    end = time.monotonic() + 60
    while not check():
        assert time.monotonic() < end, f"never saw {what}:\n" + cluster.log(0)
        time.sleep(0.05)


def test_a_node_that_failed_before_waits_while_a_clean_spare_takes_the_place(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    now = time.time()
    earlier = [FaultEntry(FLAGGED, "lost_node", now - 3600 * h, "before") for h in (1, 2)]
    (ckpt / HISTORY_FILE).write_bytes(encode_history(earlier))
    flags = [*FLAGS, f"--checkpoint-dir={ckpt}", "--heartbeat-timeout=2"]
    cluster = LocalCluster(tmp_path, 2, "2:2", flags, conf="join_timeout=60", PROBE_STEPS="400")
    try:
        _wait_for("round 0's close", lambda: bool(cluster.events("generation_start")), cluster)
        for index in (2, 3):  # the flagged spare takes the lower slot
            cluster.start_node(index, "2:2", flags)
            _wait_for(
                f"node {index}'s join", lambda i=index: "joined round 1" in cluster.log(i), cluster
            )
        cluster.kill_node(1)
        _wait_for(
            "generation 1",
            lambda: any(e.generation == 1 for e in cluster.events("generation_start")),
            cluster,
        )
        starts = [e for e in cluster.events("generation_start") if e.generation == 1]
        assert FLAGGED not in starts[0].fields["members"]
        assert SPARE in starts[0].fields["members"]
        demoted = cluster.events("standby_by_history")
        assert [(e.fields["host"], e.fields["faults"]) for e in demoted] == [(FLAGGED, 2)]
        added = [e.fields for e in cluster.events("fault_history")]
        assert [(f["host"], f["kind"], f["faults"]) for f in added] == [(KILLED, "lost_node", 1)]
        kept = read_history_file(str(ckpt / HISTORY_FILE))
        assert [(e.host, e.kind) for e in kept][-1] == (KILLED, "lost_node")
        probes = {e.fields["address"]: e.fields for e in cluster.events("net_probe")}
        assert probes["127.0.0.1"]["peer"] == KILLED and probes["127.0.0.1"]["rate_mbps"] > 0
        assert probes["127.0.0.1"]["interface"] == "lo"
    finally:
        cluster.close()
