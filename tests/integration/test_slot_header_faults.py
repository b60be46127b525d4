"""A snapshot slot whose header does not fit its file, in a real 2-node job (issue 32,
item 3): magic, version and the committed flag kept, a data length of 2**36 written.

Before: mid-run, the replicator sent that "shard" as a 64 GiB replica (refused by the
receiver's budget), the worker waited on it until it was killed as hung, and every
restart restored it (its checksums were computed over the same garbage) and died with
'shard is truncated' until the restarts ran out: exit [75, 1]. Now a misfit is a corrupt
slot, never replicated, restored or counted; the job ends like the run without it.
"""

from __future__ import annotations

import glob
import json
import struct

from tests.integration.cluster import SNAPSHOTTING, LocalCluster
from tests.integration.conftest import SNAPSHOT_FLAGS, SNAPSHOT_STEPS

STEP_AT, DATA_LEN_AT = 16, 32  # header offsets (core/snapshots/format.py's HEADER)
SAID = "holds a corrupt snapshot"


def newest_slot(agent_pid: int, rank: int) -> tuple[int, str]:
    """(step, path) of the newest committed slot of `rank` in generation 0."""
    found = []
    pattern = f"/dev/shm/rtrain-run-{agent_pid}-*/shards/snap/gen0/rank{rank}.slot*"
    for path in glob.glob(pattern):
        with open(path, "rb") as handle:
            head = handle.read(64)
        if len(head) == 64 and struct.unpack_from("<I", head, 12)[0] == 2:  # COMMITTED
            found.append((struct.unpack_from("<q", head, STEP_AT)[0], path))
    return max(found)


def overrun(path: str, step: int | None = None) -> None:
    """Write a data length of 2**36 (and a step) over the slot's header, nothing else."""
    with open(path, "r+b") as handle:
        if step is not None:
            handle.seek(STEP_AT)
            handle.write(struct.pack("<q", step))
        handle.seek(DATA_LEN_AT)
        handle.write(struct.pack("<q", 2**36))


def digests(cluster: LocalCluster) -> set[str]:
    return {json.loads(p.read_text())["digest"] for p in cluster.out.glob("final_rank*.json")}


def snapshotting_job(tmp_path) -> LocalCluster:
    return LocalCluster(
        tmp_path,
        2,
        "2",
        SNAPSHOT_FLAGS,
        script=SNAPSHOTTING,
        PROBE_STEPS=SNAPSHOT_STEPS,
        PROBE_STEP_SLEEP="0.1",
    )


def test_a_header_that_overruns_its_slot_mid_run_is_not_a_snapshot(tmp_path, snapshot_reference):
    cluster = snapshotting_job(tmp_path)
    try:
        cluster.wait_progress(8)
        step, path = newest_slot(cluster.procs[0].pid, 0)
        overrun(path, step + 1)
        codes = cluster.wait()
    finally:
        cluster.close()
    logs = cluster.log(0) + cluster.log(1)
    assert codes == [0, 0], logs
    assert SAID in cluster.log(0), logs
    assert digests(cluster) == {snapshot_reference.final}
    # Training went on: no fault, no restart, nothing restored.
    assert cluster.events("fault") == [], logs
    assert all(e["step"] is None for e in cluster.events("restore")), logs
