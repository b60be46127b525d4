"""Snapshot skeletons: tagged JSON (what shards hold now) against pickle (what they held).

A shard's skeleton is everything but the tensor bytes: the state dict's structure and
plain values. Shards come from peers and shared memory, so reading one must never run
code, and pickle can; this measures what the safe encoding costs on the step's path,
for states with many tensors, where the skeleton matters most (one big tensor makes
it noise). Each case: plan_shard (JSON) and the old walk-and-pickle, best of --reps,
in the same process; then reading the skeleton back.

  python scripts/bench_skeleton.py --layers 30,300 --reps 7
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rtrain.core.snapshots.format import plan_shard
from rtrain.core.snapshots.skeleton import decode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_launch import write_doc
from bench_snapshot import _best

ROOT = Path(__file__).resolve().parents[1]
MARK_BEGIN, MARK_END = "<!-- bench_skeleton:begin -->", "<!-- bench_skeleton:end -->"


def state_of(layers: int) -> dict[str, Any]:
    """A model of `layers` Linear layers with Adam state: 8 tensors per layer."""
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}


def pickled_skeleton(state: Any) -> bytes:
    """What the pickle format did: tensors replaced by references, the rest pickled."""

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return ("ref", str(value.dtype), tuple(value.shape), value.numel())
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [walk(v) for v in value]
            return items if isinstance(value, list) else tuple(items)
        pickle.dumps(value, protocol=5)  # the old per-value check
        return value

    return pickle.dumps(walk(state), protocol=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="30,300")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    table = Table(title="snapshot skeleton: JSON vs pickle (best of repetitions)")
    for column in ("tensors", "JSON plan", "pickle plan", "ratio", "JSON read", "skeleton"):
        table.add_column(column)
    lines = [
        MARK_BEGIN,
        "### Snapshot skeleton: JSON against pickle",
        "",
        f"`python scripts/bench_skeleton.py --layers {args.layers} --reps {args.reps}`",
        "",
        "| tensors | plan_shard (JSON) | walk + pickle (before) | JSON / pickle | read back "
        "| skeleton |",
        "|---|---|---|---|---|---|",
    ]
    for layers in (int(n) for n in args.layers.split(",")):
        state = state_of(layers)
        layout = plan_shard(state)
        json_s = _best(lambda s=state: plan_shard(s), args.reps)
        pickle_s = _best(lambda s=state: pickled_skeleton(s), args.reps)
        read_s = _best(lambda m=layout.meta, n=layout.data_len: decode(m, n), args.reps)
        row = (
            str(len(layout.tensors)),
            f"{json_s * 1e3:.1f} ms",
            f"{pickle_s * 1e3:.1f} ms",
            f"{json_s / pickle_s:.2f}",
            f"{read_s * 1e3:.1f} ms",
            f"{len(layout.meta) / 1024:.0f} KiB",
        )
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    Console().print(table)
    lines += [
        "",
        "plan_shard also makes the tensor table (a TensorRef per tensor), which the pickle",
        "walk here does not, so the ratio is an upper bound on what the JSON costs.",
        MARK_END,
    ]
    write_doc("\n".join(lines), Path(args.doc), MARK_BEGIN, MARK_END)


if __name__ == "__main__":
    main()
