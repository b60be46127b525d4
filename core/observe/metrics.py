"""A node's metrics for the monitoring people already run: folded from its events
(events.py) and a few readings the agent samples, written in Prometheus' text
exposition format for node_exporter's textfile collector.

Counters only grow over the agent's life (restarts, faults by kind, lost steps, bytes
replicated); gauges are the newest reading (generation, training step and step rate,
replication lag, the last restore's duration, the GPU verdict). Every series carries
the job's run id and the node's address as labels, so one collector can hold many
jobs' files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import Event

GPU_VERDICTS = ("ok", "warning", "critical", "unknown")  # the gauge's values: 0..3 (Verdict)


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
    # sampled
    step: int | None = None
    step_rate: float | None = None
    replication_lag: int | None = None
    _step_seen: tuple[float, int] | None = None

    def apply(self, event: Event) -> None:
        """Fold one event in."""
        if event.generation is not None:
            self.generation = event.generation
        name = event.name
        if name == "recovery":
            self.restarts += 1
            self.lost_steps += max(int(event["lost_steps"] or 0), 0)
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

    def sample(
        self, now: float, step: int | None, committed: int | None, replicated: int | None
    ) -> None:
        """Readings: the newest step a local worker's heartbeat gave, and the newest step
        committed and replicated by this node's snapshots."""
        if step is not None and step >= 0:
            if self._step_seen is not None and step > self._step_seen[1]:
                seen_at, seen_step = self._step_seen
                if now > seen_at:
                    self.step_rate = (step - seen_step) / (now - seen_at)
            if self._step_seen is None or step != self._step_seen[1]:
                self._step_seen = (now, step)
            self.step = step
        if committed is not None:
            self.replication_lag = committed - (replicated if replicated is not None else -1)

    def exposition(self) -> str:
        """The Prometheus text format of every series (unknown gauges left out)."""
        labels = f'run_id="{_escape(self.run_id)}",node="{_escape(self.agent)}"'
        out: list[str] = []

        def series(name: str, kind: str, help_text: str, values: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for extra, value in values:
                out.append(f"{name}{{{labels}{extra}}} {_number(value)}")

        def gauge(name: str, help_text: str, value: float | None) -> None:
            if value is not None:
                series(name, "gauge", help_text, [("", value)])

        gauge("rtrain_generation", "The job's generation this node runs in.", self.generation)
        series(
            "rtrain_restarts_total",
            "counter",
            "Times this node's workers restarted after a failure.",
            [("", self.restarts)],
        )
        kinds = sorted(self.faults.items()) or [("exited", 0)]
        series(
            "rtrain_faults_total",
            "counter",
            "Faults this node saw or declared, by kind.",
            [(f',kind="{_escape(k)}"', n) for k, n in kinds],
        )
        series(
            "rtrain_lost_steps_total",
            "counter",
            "Training steps done again after restores (committed past the restored step).",
            [("", self.lost_steps)],
        )
        series(
            "rtrain_replicated_bytes_total",
            "counter",
            "Bytes of snapshot shards replicated to peers, as whole shards.",
            [("", self.replicated_bytes)],
        )
        series(
            "rtrain_replication_sent_bytes_total",
            "counter",
            "Bytes actually sent for them (less where a DP twin held the chunks).",
            [("", self.sent_bytes)],
        )
        series(
            "rtrain_replication_seconds_total",
            "counter",
            "Seconds spent sending replicas.",
            [("", self.replication_seconds)],
        )
        gauge("rtrain_step", "Newest training step a local worker's heartbeat gave.", self.step)
        gauge("rtrain_step_rate", "Training steps per second, recently.", self.step_rate)
        gauge(
            "rtrain_replication_lag_steps",
            "Steps between the newest snapshot committed here and the newest replicated.",
            self.replication_lag,
        )
        gauge("rtrain_restore_seconds", "How long the last restore took.", self.restore_seconds)
        if self.gpu_verdict in GPU_VERDICTS:
            gauge(
                "rtrain_gpu_verdict",
                "The last GPU check: 0 ok, 1 warning, 2 critical, 3 unknown.",
                GPU_VERDICTS.index(self.gpu_verdict),
            )
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
