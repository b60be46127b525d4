"""A node loss is charged once, to the lost node: never to a survivor whose workers
failed first with gloo's "Connection closed by peer" (a victim of the loss), however
many times the next round's closer tries to close it (issue 32, item 2)."""

from __future__ import annotations

from tests.integration.cluster import STEPS, LocalCluster, assert_same_weights, final_records

FAST = ["--heartbeat-interval=0.5", "--heartbeat-timeout=2"]


def test_a_killed_node_is_charged_and_excluded_not_a_healthy_survivor(tmp_path, reference):
    """3 nodes of 2 workers, --max-node-failures=1: one charge excludes a node, so a
    healthy survivor charged for the loss (the audit: the store host, its victims the
    earliest failures) leaves too few nodes to close the next round, and the job ends
    75 after join_timeout."""
    flags = ["--nproc-per-node=2", "--max-node-failures=1", *FAST]
    cluster = LocalCluster(tmp_path, 3, "2:3", flags, "join_timeout=60", PROBE_STEPS=STEPS)
    try:
        cluster.wait_progress(5, timeout=120)
        cluster.kill_node(2)
        codes = cluster.wait(120)
    finally:
        cluster.close()
    logs = cluster.log(0) + cluster.log(1)
    assert codes[:2] == [0, 0], logs
    # the survivors finish with the weights of a run without the fault
    final = final_records(cluster)
    assert sorted(final) == [0, 1, 2, 3]
    for rec in final.values():
        assert rec["world_size"] == 4 and rec["applied"] == int(STEPS)
        assert_same_weights(rec["weights"], reference)
    # the loss is the only charge, once, to the killed node; no survivor is charged
    charges = [(e.generation, e["host"], e["why"]) for e in cluster.events("charge")]
    assert charges == [(0, "127.0.0.3", "lost")], charges
    assert "excluded" not in logs, logs
