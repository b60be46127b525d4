"""What a worker and its agent share to find slow ranks and work around them (issue 49):
the pace file each worker writes next to its heartbeat file, the variables that turn
the detection and the balancing on, and the balancing plan's keys in the generation's
worker store. Pure: names, the layout, encoding.

The pace file (<heartbeat file>.pace, made by the worker at its first measured step,
read by its agent by name): cumulative figures of the steps a script measured through
rtrain.data_ranks() and rtrain.average_gradients() (core/worker/pace.py):

  seq (u64)        odd while the worker writes, even after (a reader retries a torn read)
  steps (u64)      steps measured
  logical (u64)    logical data ranks held, summed over those steps
  compute_s (f64)  seconds from data_ranks() to average_gradients()'s entry, summed
  wait_s (f64)     seconds inside average_gradients()'s collective, summed
  snapshot_s (f64) seconds inside rtrain.snapshot(), summed (any script that snapshots:
                   its file then exists with steps 0 if it does not measure steps)

A plain script (no data_ranks()/average_gradients()) writes none: rtrain does not
measure it (docs/stragglers.md says what torch offers instead).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

PACE_SUFFIX = ".pace"
PACE_FORMAT = "<QQQddd"
PACE_SIZE = struct.calcsize(PACE_FORMAT)

# rtrain launch's environment (read by the agents, inherited by their workers):
# off: nothing measured or published; detect (the default): `straggler` events and
# `rtrain status`; balance: detect, and move logical data ranks off a slow rank.
STRAGGLERS = "RTRAIN_STRAGGLERS"
MODES = ("off", "detect", "balance")
# Logical data ranks per worker (a script's micro-batches, rtrain.data_ranks()): the
# logical world is the world times this, so that work can move off a slow rank in
# pieces smaller than a rank's whole share. Read by workers, under torchrun too.
MICRO_BATCHES = "RTRAIN_MICRO_BATCHES"
# Every this many data_ranks() calls the ranks of a balancing job agree on a plan.
BALANCE_EVERY = "RTRAIN_BALANCE_EVERY"
DEFAULT_BALANCE_EVERY = 8

# The balancing plan in the generation's worker store (MASTER_ADDR:MASTER_PORT, hosted
# by node 0's agent, which alone writes them): each version once, under its own key,
# then the newest version's number.
PLAN_LATEST = "rtrain/pace/plan/latest"
MAX_PLAN_BYTES = 1 << 22


def plan_key(version: int) -> str:
    return f"rtrain/pace/plan/{version}"


def mode(value: str | None) -> str:
    """The STRAGGLERS mode a value names; detect when unset or unknown."""
    text = (value or "").strip().lower()
    return text if text in MODES else "detect"


def micro_batches(value: str | None) -> int:
    """MICRO_BATCHES' value: a positive count, 1 when unset or not one."""
    text = (value or "").strip()
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else 1


def pace_path(heartbeat_file: str) -> str:
    return heartbeat_file + PACE_SUFFIX


@dataclass(frozen=True)
class Pace:
    """One rank's cumulative figures (a pace file's content)."""

    steps: int = 0
    logical: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    snapshot_s: float = 0.0  # the agent's own (badput): not in the store's records

    def as_list(self) -> list[float]:
        return [self.steps, self.logical, round(self.compute_s, 6), round(self.wait_s, 6)]


def unpack_pace(data: bytes) -> tuple[int, Pace] | None:
    """(seq, figures) of a pace file's bytes; None for a short read or an odd seq (the
    worker was writing)."""
    if len(data) != PACE_SIZE:
        return None
    seq, steps, logical, compute, wait, snapshot = struct.unpack(PACE_FORMAT, data)
    if seq % 2:
        return None
    return seq, Pace(steps, logical, compute, wait, snapshot)


@dataclass(frozen=True)
class Plan:
    """A balancing plan: its version (1, 2, ...) and each slow rank's relative speed
    (the others' is 1.0): core/repair/shares.balance_shares turns it into shares."""

    version: int
    speeds: Mapping[int, float]

    def encode(self) -> bytes:
        speeds = {str(r): round(s, 6) for r, s in sorted(self.speeds.items())}
        return json.dumps({"version": self.version, "speeds": speeds}).encode()

    @classmethod
    def decode(cls, payload: bytes) -> Plan | None:
        """The plan, or None for anything rtrain did not write."""
        if len(payload) > MAX_PLAN_BYTES:
            return None
        try:
            data = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        version, speeds = data.get("version"), data.get("speeds")
        if not isinstance(version, int) or version < 1 or not isinstance(speeds, dict):
            return None
        found: dict[int, float] = {}
        for key, value in speeds.items():
            if not (isinstance(key, str) and key.isdigit()):
                return None
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                return None
            found[int(key)] = float(value)
        return cls(version, found)
