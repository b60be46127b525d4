"""The node metrics' conventions: the node's label is not Kubernetes' `node`,
rtrain_build_info, the recoveries' downtime as a histogram, and the goodput gauge."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rtrain.core.observe.events import event_line, parse_event
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
