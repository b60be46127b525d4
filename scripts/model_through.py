"""Train through a fault, modelled at scale (issue 46): the survivors' stall and what the
job loses until it is at full size again, from published figures (model_repair.py's
Assumptions, each field with its source).

Under rtrain.repairable(train_through=True) the survivors go on at once in a smaller
group, a peer doing the failed rank's data share, while the replacement starts up; when
it is ready it joins at a step boundary and is handed a kept rank's snapshot. So:

  survivors' stall  detection + the agents' commit of the next generation + the broken
                    communicator's abort + the group rebuilt over the survivors: created
                    anew (what rtrain does today: a new group of the kept ranks) or shrunk
                    (ncclCommShrink / torch's shrink_group). The replacement's start-up is
                    not in it.
  next step         the stall + one step at the interim's rate (a peer does two shares)
  replacement ready detection + commit + its cold start (process, CUDA context, data
                    loaders, compile): the interim, at the interim's rate
  rejoin stall      the whole group again (created anew / grown: no published figure for a
                    grow, taken as a shrink's) + the shard handed over from a peer + copied
                    to the GPU
  lost              seconds of full-size training lost until full size again: the stalls,
                    plus the interim's shortfall; a process restart loses its whole
                    fault -> next step less one step (model_repair.py)

Two faults: a worker crash (one GPU's rank; its replacement starts on the same node) and a
node lost (8 ranks; a replacement node's workers start cold). Targets (issue 46): the
survivors' stall <= 15 s at 1,024 GPUs and <= 30 s at 16,384.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAULTS = {"crash": "worker crash", "node": "node lost"}
REBUILDS = {"recreate": "group created anew (today)", "shrink": "communicator shrink"}
TARGETS = {1024: 15.0, 16384: 30.0}


def stall(a: Any, fault: str, rebuild: str, gpus: int) -> dict[str, float]:
    """The survivors' stall, by phase: fault -> training again in the smaller group."""
    lost = 1 if fault == "crash" else a.gpus_per_node
    out = {"detect": a.detect_crash_s if fault == "crash" else a.detect_node_s}
    out["commit"] = a.commit_s
    out["abort"] = a.abort_s
    out["rebuild"] = a.shrink_s if rebuild == "shrink" else a.nccl_init_s(gpus - lost)
    return out


def replacement_ready(a: Any, fault: str) -> float:
    """Fault -> the replacement's start-up done (it then says it is ready)."""
    detect = a.detect_crash_s if fault == "crash" else a.detect_node_s
    cold = a.process_start_s + a.cuda_context_s + a.loader_start_s + a.compile_warm_s
    return detect + a.commit_s + cold


def rejoin(a: Any, rebuild: str, gpus: int) -> dict[str, float]:
    """The survivors' second stall, at the step boundary where the replacement joins."""
    shard = a.state_bytes / gpus
    group = a.shrink_s if rebuild == "shrink" else a.nccl_init_s(gpus)
    return {"group": group, "hand-over": shard / a.peer_bytes_s, "to GPU": shard / a.h2d_bytes_s}


def figures(a: Any, sizes: list[int]) -> list[dict]:
    from model_repair import phases

    rows = []
    for gpus in sizes:
        for fault in FAULTS:
            restart = phases(a, "crash" if fault == "crash" else "standby", "restart", gpus)
            for rebuild in REBUILDS:
                first = stall(a, fault, rebuild, gpus)
                second = rejoin(a, rebuild, gpus)
                stalled = sum(first.values())
                ready = replacement_ready(a, fault)
                interim = max(0.0, ready - stalled)
                shortfall = interim * (1 - 1 / a.interim_step_factor)
                rows.append(
                    {
                        "gpus": gpus,
                        "fault": fault,
                        "rebuild": rebuild,
                        "stall": first,
                        "stall_s": stalled,
                        "next_step_s": stalled + a.interim_step_factor * a.step_s,
                        "ready_s": ready,
                        "rejoin": second,
                        "rejoin_s": sum(second.values()),
                        "lost_s": stalled + shortfall + sum(second.values()),
                        "restart_lost_s": sum(restart.values()) - a.step_s,
                        "target_s": TARGETS.get(gpus),
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| GPUs | fault | survivors' group | survivors' stall | target | met | next step "
        "| replacement ready | rejoin stall | lost until full size | process restart lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = r["target_s"]
        met = "-" if target is None else ("yes" if r["stall_s"] <= target else "no")
        lines.append(
            f"| {r['gpus']:,} | {FAULTS[r['fault']]} | {REBUILDS[r['rebuild']]} | "
            f"{r['stall_s']:.1f} s | {'-' if target is None else f'{target:g} s'} | {met} | "
            f"{r['next_step_s']:.1f} s | {r['ready_s']:.1f} s | {r['rejoin_s']:.1f} s | "
            f"{r['lost_s']:.1f} s | {r['restart_lost_s']:.1f} s |"
        )
    return "\n".join(lines)


COLOURS = {
    "detect": "#9e9e9e",
    "commit": "#616161",
    "abort": "#795548",
    "rebuild": "#43a047",
    "interim": "#ffe082",
    "group": "#2e7d32",
    "hand-over": "#1565c0",
    "to GPU": "#42a5f5",
}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["gpus"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 3.8), dpi=120)
    axes = axes if len(sizes) > 1 else [axes]
    for ax, gpus in zip(axes, sizes, strict=True):
        mine = [r for r in rows if r["gpus"] == gpus]
        for y, r in enumerate(mine):
            left = 0.0
            for phase, seconds in r["stall"].items():
                ax.barh(y, seconds, left=left, color=COLOURS[phase], edgecolor="white", lw=0.5)
                left += seconds
            ax.text(left + 0.5, y - 0.22, f"stall {left:.1f} s", fontsize=7)
            interim = max(0.0, r["ready_s"] - left)
            ax.barh(y, interim, left=left, color=COLOURS["interim"], height=0.35)
            left += interim
            for phase, seconds in r["rejoin"].items():
                ax.barh(y, seconds, left=left, color=COLOURS[phase], edgecolor="white", lw=0.5)
                left += seconds
            ax.text(left + 0.5, y + 0.22, f"full size at {left:.0f} s", fontsize=7)
        if TARGETS.get(gpus):
            ax.axvline(TARGETS[gpus], color="#d32f2f", ls="--", lw=1)
            bottom = len(mine) - 0.45
            ax.text(
                TARGETS[gpus], bottom, f" target {TARGETS[gpus]:g} s", color="#d32f2f", fontsize=7
            )
        labels = [f"{FAULTS[r['fault']]}\n{REBUILDS[r['rebuild']]}" for r in mine]
        ax.set_yticks(range(len(mine)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{gpus:,} GPUs")
        ax.set_xlabel("seconds from the fault")
        ax.grid(True, axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    names = [n if n != "interim" else "interim (a peer does two shares)" for n in COLOURS]
    fig.legend(handles, names, loc="lower center", ncol=len(COLOURS), fontsize=7)
    fig.suptitle("Train through a fault: the survivors' stall, the interim, the rejoin (model)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def report(a: Any, sizes: list[int], png: Path, as_markdown: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = figures(a, sizes)
    table = Table(title="train through a fault (model, seconds)")
    for column in ("GPUs", "fault", "group", "stall", "target", "next step", "ready", "rejoin",
                   "lost", "restart lost"):  # fmt: skip
        table.add_column(column)
    for r in rows:
        table.add_row(
            f"{r['gpus']:,}", FAULTS[r["fault"]], REBUILDS[r["rebuild"]], f"{r['stall_s']:.1f}",
            "-" if r["target_s"] is None else f"{r['target_s']:g}", f"{r['next_step_s']:.1f}",
            f"{r['ready_s']:.1f}", f"{r['rejoin_s']:.1f}", f"{r['lost_s']:.1f}",
            f"{r['restart_lost_s']:.1f}",
        )  # fmt: skip
    Console(width=130).print(table)
    if as_markdown:
        print(markdown(rows))
    try:
        plot(rows, png)
        print(f"wrote {png}")
    except ImportError:
        print("no matplotlib: no PNG (pip install matplotlib)")
