"""The node metrics' conventions: the node's label is not Kubernetes' `node`,
rtrain_build_info, the recoveries' downtime as a histogram, the goodput gauge, and the
time by cause."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rtrain.core.observe.badput.causes import CAUSES
from rtrain.core.observe.badput.node import LiveBeats
from rtrain.core.observe.events import Event, event_line, parse_event
from rtrain.core.observe.metrics import RECOVERY_BUCKETS, NodeMetrics


def ev(name: str, t: float, gen: int = 0, **fields: object):
    event = parse_event(event_line(name, t, "10.0.0.1", 0, gen, fields))
    assert event is not None
    return event


def start(t: float, gen: int):
    return ev(
        "generation_start", t, gen, nodes=1, world_size=1, members=["10.0.0.1"], restored_step=None
    )


def end(t: float, gen: int, outcome: str):
    return ev(
        "generation_end", t, gen, outcome=outcome, seconds=1.0, last_step=None, reached_step=None
    )


def samples(metrics: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition())
        for s in family.samples
    }


def test_no_series_carries_a_node_label_and_build_info_is_one() -> None:
    metrics = NodeMetrics("job", "10.0.0.1", build={"version": "0.1.0", "torch": "2.13.0"})
    metrics.apply(start(100.0, 0))
    found = samples(metrics)
    assert found
    for _, labels in found:
        names = dict(labels)
        assert "node" not in names and names["rtrain_node"] == "10.0.0.1"
    assert (
        found[
            (
                "rtrain_build_info",
                (
                    ("rtrain_node", "10.0.0.1"),
                    ("run_id", "job"),
                    ("torch", "2.13.0"),
                    ("version", "0.1.0"),
                ),
            )
        ]
        == 1
    )


def test_recoveries_fill_the_histogram_and_the_goodput_takes_their_downtime_out() -> None:
    metrics = NodeMetrics("job", "10.0.0.1")
    labels = (("rtrain_node", "10.0.0.1"), ("run_id", "job"))
    metrics.apply(start(100.0, 0))
    assert ("rtrain_goodput_ratio", labels) not in samples(metrics)  # no time passed yet
    metrics.apply(end(150.0, 0, "local_failure"))
    metrics.apply(start(151.0, 1))
    # a recovery under way counts from its generation's end: 10 s down of 60
    metrics.sample(1.0, None, None, None, wall=160.0)
    assert samples(metrics)[("rtrain_goodput_ratio", labels)] == pytest.approx(50 / 60)
    metrics.apply(ev("recovery", 154.0, 1, from_generation=0, down_s=4.0, lost_steps=0))
    metrics.apply(end(180.0, 1, "membership_change"))
    metrics.apply(start(181.0, 2))
    metrics.apply(ev("recovery", 200.0, 2, from_generation=1, down_s=20.0, lost_steps=0))
    found = samples(metrics)
    # 100 s since the first start, 24 s of them down
    assert found[("rtrain_goodput_ratio", labels)] == pytest.approx(76 / 100)
    bucket = {
        dict(k[1])["le"]: v for k, v in found.items() if k[0] == "rtrain_recovery_seconds_bucket"
    }
    assert len(bucket) == len(RECOVERY_BUCKETS) + 1
    assert [bucket[le] for le in ("2.0", "5.0", "10.0", "20.0", "+Inf")] == [0, 1, 1, 2, 2]
    assert found[("rtrain_recovery_seconds_count", labels)] == 2
    assert found[("rtrain_recovery_seconds_sum", labels)] == 24


def test_steps_done_again_cost_their_time_at_the_step_rate() -> None:
    metrics = NodeMetrics("job", "10.0.0.1")
    labels = (("rtrain_node", "10.0.0.1"), ("run_id", "job"))
    metrics.apply(start(0.0, 0))
    metrics.apply(end(40.0, 0, "local_failure"))
    metrics.apply(ev("recovery", 50.0, 1, from_generation=0, down_s=10.0, lost_steps=20))
    metrics.sample(0.0, 100, None, None, wall=90.0)
    metrics.sample(10.0, 120, None, None, wall=100.0)  # 2 steps a second
    # 100 s: 10 down, 20 steps done again at 2 a second
    assert samples(metrics)[("rtrain_goodput_ratio", labels)] == pytest.approx(80 / 100)


def test_the_time_by_cause_counts_this_nodes_settled_time_and_never_goes_down() -> None:
    metrics = NodeMetrics("job", "10.0.0.1")

    def by_cause() -> dict[str, float]:
        return {
            dict(labels)["cause"]: value
            for (name, labels), value in samples(metrics).items()
            if name == "rtrain_job_seconds_total"
        }

    metrics.apply(
        ev("agent_start", 0.0, None, nproc=1, run_id="job", backend="c10d", max_restarts=1)
    )
    metrics.apply(start(10.0, 0))
    assert set(by_cause()) == set(CAUSES) and by_cause()["startup"] == 10
    metrics.sample(1.0, 5, None, None, wall=40.0, beats=LiveBeats(20.0, 40.0))
    assert (by_cause()["startup"], by_cause()["training"]) == (20, 20)
    failed = end(60.0, 0, "local_failure")
    beats = {"first_seen_step": 0, "first_seen_t": 20.0, "reached_step": 9, "last_beat_t": 45.0}
    metrics.apply(ev(failed.name, 60.0, 0, **{**failed.fields, **beats}))
    hang = {"kind": "hang", "rank": 0, "fault_node": 0, "host": "10.0.0.1", "message": "hung"}
    metrics.apply(ev("fault", 60.0, 0, **hang, fault_t=45.0))
    assert sum(by_cause().values()) == 45  # the recovery is counted once the next one starts
    metrics.apply(start(64.0, 1))
    found = by_cause()
    assert (found["hang_wait"], found["restart"], sum(found.values())) == (15, 4, 64)
    goodput = samples(metrics)[
        ("rtrain_job_goodput_ratio", (("rtrain_node", "10.0.0.1"), ("run_id", "job")))
    ]
    assert goodput == pytest.approx(25 / 64)
    metrics.sample(2.0, 30, None, None, wall=80.0, beats=LiveBeats(65.0, 80.0))
    assert by_cause()["training"] == 25 + 15
    # a straggler said late, from 70: its time was counted as training, which stays
    metrics.apply(Event("straggler", 81.0, "10.0.0.1", 0, 1, {"rank": 0, "since": 70.0}))
    assert (by_cause()["training"], by_cause()["straggler"]) == (40, 10)
