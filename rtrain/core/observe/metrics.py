"""A node's metrics for the monitoring people already run: folded from its events
(events.py) and a few readings the agent samples, written in Prometheus' text
exposition format for node_exporter's textfile collector.

Counters only grow over the agent's life (restarts, faults by kind, lost steps, bytes
replicated); gauges are the newest reading (generation, training step and step rate,
replication lag, the last restore's duration, the GPU verdict, the goodput); the
recoveries' downtime is a histogram. Every series carries the job's run id and the
node's address as labels (`run_id`, `rtrain_node`: not `node`, which Kubernetes'
scrape configurations set to the Kubernetes node and which Prometheus would then
rename `exported_node`), so one collector can hold many jobs' files.
`rtrain_build_info` is 1, labelled with the versions (the build_info convention).

The goodput gauge is this node's view, as of its newest reading: the time since its
first generation started, less the recoveries' downtime (a recovery under way counts
from its generation's end), less the steps done again at the recent step rate, over
that time. `rtrain report` gives the job's, from every node's events.

`rtrain_job_seconds_total{cause}` is this node's own time by cause (badput.py says
each cause): from its agent's start, every second to one cause, from its own events
and its running generation's heartbeats. They count up to the newest settled instant
(badput.settled_end: a running generation's newest heartbeat step; a recovery's time
once the next generation starts, when the events that say what it was have come), so
their sum trails the time since the agent started by at most that much. A counter
never goes down: where a later event puts time already counted under another cause (a
straggler's `since`) each keeps its highest value, and their sum runs ahead by that
time. `rtrain_job_goodput_ratio` is training's share of their sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .badput.causes import CAUSES, TRAINING
from .badput.live import node_split
from .badput.node import ACCOUNTED, LiveBeats
from .events import Event

GPU_VERDICTS = ("ok", "warning", "critical", "unknown")  # the gauge's values: 0..3 (Verdict)
NODE_LABEL = "rtrain_node"  # the node's address; `node` is Kubernetes' own
# rtrain_recovery_seconds' buckets: a restart from memory takes seconds, a lost node's
# up to a join timeout (600 s by default)
RECOVERY_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass
class NodeMetrics:
    run_id: str
    agent: str
    generation: int | None = None
    restarts: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    lost_steps: int = 0
    replicated_bytes: int = 0
    sent_bytes: int = 0
    replication_seconds: float = 0.0
    restore_seconds: float | None = None
    gpu_verdict: str | None = None
    build: dict[str, str] = field(default_factory=dict)  # rtrain_build_info's labels
    recovery_buckets: list[int] = field(default_factory=lambda: [0] * len(RECOVERY_BUCKETS))
    down_seconds: float = 0.0  # the recoveries' downtime, summed
    started_t: float | None = None  # wall clock: the first generation's start
    down_since: float | None = None  # wall clock: a failed generation's end, not recovered
    newest_t: float | None = None  # wall clock: the newest event or reading
    # sampled
    step: int | None = None
    step_rate: float | None = None
    replication_lag: int | None = None
    _step_seen: tuple[float, int] | None = None
    # the wall time by cause: this node's events the accounting reads, its running
    # generation's heartbeats, and each cause's highest count so far
    job_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    _accounted: list[Event] = field(default_factory=list)
    _live: LiveBeats | None = None

    def apply(self, event: Event) -> None:
        """Fold one event in."""
        if event.generation is not None:
            self.generation = event.generation
        self._seen(event.t)
        name = event.name
        if name == "generation_start" and self.started_t is None:
            self.started_t = event.t
        elif name == "generation_end" and event["outcome"] != "succeeded":
            self.down_since = event.t
        elif name == "recovery":
            self.restarts += 1
            self.lost_steps += max(int(event["lost_steps"] or 0), 0)
            down = max(float(event["down_s"]), 0.0)
            self.down_seconds += down
            for index, bound in enumerate(RECOVERY_BUCKETS):
                if down <= bound:
                    self.recovery_buckets[index] += 1
            self.down_since = None
        elif name == "fault":
            kind = str(event["kind"])
            self.faults[kind] = self.faults.get(kind, 0) + 1
        elif name == "replication":
            self.replicated_bytes += int(event["full_bytes"])
            self.sent_bytes += int(event["sent_bytes"])
            self.replication_seconds += float(event["seconds"])
        elif name == "restore":
            self.restore_seconds = float(event["seconds"])
        elif name == "gpu":
            self.gpu_verdict = str(event["verdict"])
        if name in ACCOUNTED:
            if name == "generation_start":
                self._live = None  # the heartbeats seen were the last generation's
            self._accounted.append(event)
            self._account()

    def _account(self) -> None:
        for cause, seconds in node_split(self._accounted, self._live).items():
            self.job_seconds[cause] = max(self.job_seconds.get(cause, 0.0), seconds)

    def _seen(self, wall: float) -> None:
        if self.newest_t is None or wall > self.newest_t:
            self.newest_t = wall

    def sample(
        self,
        now: float,
        step: int | None,
        committed: int | None,
        replicated: int | None,
        wall: float | None = None,
        beats: LiveBeats | None = None,
    ) -> None:
        """Readings: the newest step a local worker's heartbeat gave, and the newest step
        committed and replicated by this node's snapshots. now: a monotonic clock (the
        step rate); wall: the events' clock (the goodput), when known; beats: the
        running generation's first heartbeat step and newest, on the events' clock."""
        if wall is not None:
            self._seen(wall)
        if beats is not None:
            self._live = beats
            self._account()
        if step is not None and step >= 0:
            if self._step_seen is not None and step > self._step_seen[1]:
                seen_at, seen_step = self._step_seen
                if now > seen_at:
                    self.step_rate = (step - seen_step) / (now - seen_at)
            if self._step_seen is None or step != self._step_seen[1]:
                self._step_seen = (now, step)
            self.step = step
        if committed is not None and replicated is not None:
            self.replication_lag = committed - replicated

    @property
    def goodput(self) -> float | None:
        """The share of the time since the first generation started spent on steps kept
        (None before a generation started, or with no time passed)."""
        if self.started_t is None or self.newest_t is None or self.newest_t <= self.started_t:
            return None
        elapsed = self.newest_t - self.started_t
        lost = self.down_seconds
        if self.down_since is not None:
            lost += max(self.newest_t - self.down_since, 0.0)
        if self.step_rate:
            lost += self.lost_steps / self.step_rate
        return min(max((elapsed - lost) / elapsed, 0.0), 1.0)

    def exposition(self) -> str:
        """The Prometheus text format of every series (unknown gauges left out)."""
        text = _Exposition(f'run_id="{_escape(self.run_id)}",{NODE_LABEL}="{_escape(self.agent)}"')
        self._identity(text)
        self._counters(text)
        self._readings(text)
        self._recovery_histogram(text)
        self._verdicts(text)
        return text.text()

    def _identity(self, text: _Exposition) -> None:
        if self.build:
            built = "".join(f',{k}="{_escape(v)}"' for k, v in sorted(self.build.items()))
            text.series("rtrain_build_info", "gauge", "rtrain's build: its versions.", [(built, 1)])
        text.gauge("rtrain_generation", "The job's generation this node runs in.", self.generation)

    def _counters(self, text: _Exposition) -> None:
        text.counter(
            "rtrain_restarts_total",
            "Times this node's workers restarted after a failure.",
            self.restarts,
        )
        kinds = sorted(self.faults.items()) or [("exited", 0)]
        text.series(
            "rtrain_faults_total",
            "counter",
            "Faults this node saw or declared, by kind.",
            [(f',kind="{_escape(k)}"', n) for k, n in kinds],
        )
        text.counter(
            "rtrain_lost_steps_total",
            "Training steps done again after restores (committed past the restored step).",
            self.lost_steps,
        )
        text.counter(
            "rtrain_replicated_bytes_total",
            "Bytes of snapshot shards replicated to peers, as whole shards.",
            self.replicated_bytes,
        )
        text.counter(
            "rtrain_replication_sent_bytes_total",
            "Bytes actually sent for them (less where a DP twin held the chunks).",
            self.sent_bytes,
        )
        text.counter(
            "rtrain_replication_seconds_total",
            "Seconds spent sending replicas.",
            self.replication_seconds,
        )
        text.series(
            "rtrain_job_seconds_total",
            "counter",
            "This node's time by cause, every second to one (training, startup, "
            "rendezvous, restore, restart, hang_wait, repair, reduced_size, straggler, "
            "snapshot_overhead), up to its newest settled instant.",
            [(f',cause="{c}"', s) for c, s in self.job_seconds.items()],
        )

    def _readings(self, text: _Exposition) -> None:
        text.gauge(
            "rtrain_step", "Newest training step a local worker's heartbeat gave.", self.step
        )
        text.gauge("rtrain_step_rate", "Training steps per second, recently.", self.step_rate)
        text.gauge(
            "rtrain_replication_lag_steps",
            "Steps between the newest snapshot committed here and the newest replicated.",
            self.replication_lag,
        )
        text.gauge(
            "rtrain_restore_seconds", "How long the last restore took.", self.restore_seconds
        )

    def _recovery_histogram(self, text: _Exposition) -> None:
        name = "rtrain_recovery_seconds"
        text.series(
            name,
            "histogram",
            "Each recovery's downtime: from the failed generation's end to the next first step.",
            [],
        )
        for bound, count in zip(RECOVERY_BUCKETS, self.recovery_buckets, strict=True):
            text.sample(f"{name}_bucket", f',le="{float(bound)!r}"', count)
        text.sample(f"{name}_bucket", ',le="+Inf"', self.restarts)
        text.sample(f"{name}_sum", "", self.down_seconds)
        text.sample(f"{name}_count", "", self.restarts)

    def _verdicts(self, text: _Exposition) -> None:
        text.gauge(
            "rtrain_goodput_ratio",
            "Share of the time since the first generation started spent on steps kept "
            "(this node's view: downtime and steps done again taken out).",
            self.goodput,
        )
        accounted = sum(self.job_seconds.values())
        text.gauge(
            "rtrain_job_goodput_ratio",
            "Training's share of rtrain_job_seconds_total (steps later done again "
            "count as training here; rtrain_goodput_ratio takes them out).",
            self.job_seconds[TRAINING] / accounted if accounted > 0 else None,
        )
        if self.gpu_verdict in GPU_VERDICTS:
            text.gauge(
                "rtrain_gpu_verdict",
                "The last GPU check: 0 ok, 1 warning, 2 critical, 3 unknown.",
                GPU_VERDICTS.index(self.gpu_verdict),
            )


class _Exposition:
    """Prometheus' text format, line by line, every sample under one node's labels."""

    def __init__(self, labels: str) -> None:
        self._labels = labels
        self._lines: list[str] = []

    def series(self, name: str, kind: str, help_text: str, values: list[tuple[str, float]]) -> None:
        """A family's HELP and TYPE, then a sample per (extra labels, value)."""
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
        for extra, value in values:
            self.sample(name, extra, value)

    def counter(self, name: str, help_text: str, value: float) -> None:
        self.series(name, "counter", help_text, [("", value)])

    def gauge(self, name: str, help_text: str, value: float | None) -> None:
        """Left out while unknown (None)."""
        if value is not None:
            self.series(name, "gauge", help_text, [("", value)])

    def sample(self, name: str, extra: str, value: float) -> None:
        self._lines.append(f"{name}{{{self._labels}{extra}}} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
