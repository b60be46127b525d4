"""PipelineJob: what the ReCycle planner plans for.

A job is DP replicas of a PP-stage pipeline; each replica runs `microbatches`
micro-batches per iteration. Per stage: the forward (F), the backward for the input
gradient (B, on the critical path), the backward for the weight gradient (W, which
can wait for a bubble), and the optimizer step; plus the time to move activations
between stages, and how many micro-batches' activations a worker may hold at once.

Durations come from a measured profile (a small JSON file) or from a model
description (GPT-style FLOP counts on a device's FLOP rate). Everything is
validated: a bad value is a PlannerError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError


class PlannerError(UsageError):
    """A job or a failure set the planner cannot take: the message names the value."""


Worker = tuple[int, int]  # (replica, stage), both from 0


@dataclass(frozen=True)
class PipelineJob:
    dp: int
    pp: int
    microbatches: int
    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    optimizer: tuple[float, ...]
    transfer: float = 0.0
    memory_limit: int | None = None  # None: as much as 1F1B needs at stage 0 (pp)

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "microbatches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlannerError(f"{name} must be a positive integer, not {value!r}")
        for name in ("forward", "backward_input", "backward_weight", "optimizer"):
            values = getattr(self, name)
            if len(values) != self.pp:
                raise PlannerError(f"{name}: {len(values)} durations for {self.pp} stages")
            for stage, value in enumerate(values):
                if not isinstance(value, (int, float)) or not value >= 0:
                    raise PlannerError(f"{name}[{stage}] = {value!r}: durations are >= 0")
        if not isinstance(self.transfer, (int, float)) or not self.transfer >= 0:
            raise PlannerError(f"transfer = {self.transfer!r}: a duration is >= 0")
        if self.memory_limit is not None and (
            not isinstance(self.memory_limit, int) or self.memory_limit < 1
        ):
            raise PlannerError(
                f"memory limit {self.memory_limit!r}: no schedule runs without room for "
                "one micro-batch's activations (it must be >= 1)"
            )

    @property
    def memory(self) -> int:
        return self.pp if self.memory_limit is None else self.memory_limit

    def duration(self, kind: str, stage: int) -> float:
        return {
            "F": self.forward,
            "B": self.backward_input,
            "W": self.backward_weight,
            "OPT": self.optimizer,
        }[kind][stage]

    @classmethod
    def uniform(
        cls,
        dp: int,
        pp: int,
        microbatches: int,
        f: float = 1.0,
        b: float = 1.0,
        w: float = 1.0,
        opt: float = 0.0,
        transfer: float = 0.0,
        memory_limit: int | None = None,
    ) -> PipelineJob:
        if not isinstance(pp, int) or pp < 1:
            raise PlannerError(f"pp must be a positive integer, not {pp!r}")
        return cls(
            dp,
            pp,
            microbatches,
            (f,) * pp,
            (b,) * pp,
            (w,) * pp,
            (opt,) * pp,
            transfer,
            memory_limit,
        )

    @classmethod
    def from_profile(
        cls, profile: Mapping[str, Any], dp: int, pp: int, microbatches: int
    ) -> PipelineJob:
        """A measured profile: {"forward": [...], "backward_input": [...],
        "backward_weight": [...], "optimizer": [...], "transfer": s, "memory_limit": n};
        a single number stands for every stage."""
        if not isinstance(profile, Mapping):
            raise PlannerError("a profile is a JSON object of per-stage durations")
        unknown = set(profile) - {*DURATIONS, "transfer", "memory_limit"}
        if unknown:
            raise PlannerError(f"profile: unknown keys {sorted(unknown)}")
        per_stage = {}
        for key in DURATIONS:
            if key not in profile:
                raise PlannerError(f"profile: {key} is missing")
            per_stage[key] = _per_stage(profile[key], pp, key)
        return cls(
            dp,
            pp,
            microbatches,
            transfer=profile.get("transfer", 0.0),
            memory_limit=profile.get("memory_limit"),
            **per_stage,
        )

    @classmethod
    def from_model(
        cls,
        dp: int,
        pp: int,
        microbatches: int,
        layers_per_stage: int,
        hidden: int,
        seq_len: int,
        microbatch_size: int,
        flops: float,
        link_bandwidth: float = 100e9,
        memory_limit: int | None = None,
    ) -> PipelineJob:
        """GPT-style durations: a layer's forward is 24*b*s*h^2 + 4*b*s^2*h FLOPs; the
        backward is twice that, split evenly between B and W; the optimizer reads and
        writes the stage's 12*h^2 parameters per layer (negligible FLOPs, memory bound,
        modelled as one forward of a single token per parameter); activations of
        b*s*h 2-byte values cross each stage boundary over `link_bandwidth` bytes/s."""
        for name, value in (
            ("layers_per_stage", layers_per_stage),
            ("hidden", hidden),
            ("seq_len", seq_len),
            ("microbatch_size", microbatch_size),
        ):
            if not isinstance(value, int) or value < 1:
                raise PlannerError(f"{name} must be a positive integer, not {value!r}")
        if not flops > 0 or not link_bandwidth > 0:
            raise PlannerError("the FLOP rate and the link bandwidth must be > 0")
        b, s, h = microbatch_size, seq_len, hidden
        forward = layers_per_stage * (24 * b * s * h * h + 4 * b * s * s * h) / flops
        optimizer = layers_per_stage * 12 * h * h * 16 / 2e12  # 16 B/param at 2 TB/s
        transfer = 2 * b * s * h / link_bandwidth
        return cls.uniform(
            dp, pp, microbatches, forward, forward, forward, optimizer, transfer, memory_limit
        )


DURATIONS = ("forward", "backward_input", "backward_weight", "optimizer")


def _per_stage(value: Any, pp: int, key: str) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * pp
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != pp:
            raise PlannerError(f"profile: {key} has {len(value)} values for {pp} stages")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise PlannerError(f"profile: {key} must hold numbers")
        return tuple(float(v) for v in value)
    raise PlannerError(f"profile: {key} must be a number or a list of {pp} numbers")
