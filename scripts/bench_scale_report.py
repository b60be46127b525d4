"""bench_scale.py report: docs/bench_scale.json as the Markdown tables of
docs/benchmarks.md."""

from __future__ import annotations


def _cell(result: dict[str, object], key: str, unit: str = "") -> str:
    value = result.get(key)
    return "-" if value is None else f"{value}{unit}"


def _spares(result: dict[str, object]) -> int:
    return int(result.get("spares", 0) or 0)  # type: ignore[call-overload]


def _agents(result: dict[str, object]) -> str:
    spares = _spares(result)
    return f"{result['nodes']} + {spares} spares" if spares else str(result["nodes"])


def _spare_table(rows: list[dict[str, object]]) -> list[str]:
    """The hot spares' figures of the sim runs with --spares (issue 36 item 6): what a
    waiting spare costs the store against an active node, and how soon the first spare
    is let in after a loss."""
    if not rows:
        return []
    lines = [
        "",
        "| agents | store | spare requests / spare / s | by operation | active requests "
        "/ agent / s | first spare in after declared | committed after declared "
        "| spare requests through the commit (per spare) | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        by_op = r.get("spare_requests_per_spare_s_by_op") or {}
        ops = ", ".join(f"{op} {n}" for op, n in sorted(by_op.items())) or "-"  # type: ignore[attr-defined]
        first = r.get("error") or _cell(r, "spare_admitted_after_declared_s", " s")
        lines.append(
            f"| {_agents(r)} | {r['backend']} | {_cell(r, 'spare_requests_per_spare_s')} | "
            f"{ops} | {_cell(r, 'requests_per_agent_s')} | {first} | "
            f"{_cell(r, 'commit_after_declared_s', ' s')} | "
            f"{_cell(r, 'spare_requests_per_spare_through_commit')} | "
            f"{_cell(r, 'load_before')} -> {_cell(r, 'load_after')} |"
        )
    return lines


def report(data: dict[str, list[dict[str, object]]]) -> str:
    """docs/bench_scale.json as the Markdown tables of docs/benchmarks.md."""
    lines = [
        "| agents | launcher | startup | CPU to start: node 0 / an agent | idle agent CPU "
        "| store host CPU | store requests / agent / s | silent loss: detected "
        "| committed after declared | workers running |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(data.get("real", []), key=lambda r: (r["nodes"], str(r["backend"]))):
        name = {"c10d": "rtrain, TCPStore", "etcd": "rtrain, etcd"}.get(
            str(r["backend"]), "torchrun"
        )
        lines.append(
            f"| {r['nodes']} | {name} | {_cell(r, 'startup_s', ' s')} | "
            f"{_cell(r, 'start_cpu_s_node0', ' s')} / {_cell(r, 'start_cpu_s_agent', ' s')} | "
            f"{_cell(r, 'idle_agent_cpu_pct', ' %')} | {_cell(r, 'store_host_cpu_pct', ' %')} | "
            f"{_cell(r, 'store_requests_per_agent_s')} | {_cell(r, 'detect_s', ' s')} | "
            f"{_cell(r, 'commit_after_declared_s', ' s')} | "
            f"{r.get('loss') or _cell(r, 'loss_to_workers_s', ' s')} |"
        )
    lines += [
        "",
        "| agents | processes | store | generation 0 | requests / agent / s | bytes / agent / s "
        "| store server CPU (per agent) | simulator CPU | loop late p99 (window / commit) "
        "| silent loss: detected | last survivor left | committed after declared "
        "| bytes per generation | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    sims = sorted(data.get("sim", []), key=lambda r: (str(r["backend"]), r["nodes"], _spares(r)))
    for r in sims:
        if "error" in r:
            lines.append(f"| {_agents(r)} | | {r['backend']} | {r['error']} |" + " |" * 10)
            continue
        late = [
            str(r.get(k, {}).get("p99_ms", "-"))  # type: ignore[attr-defined]
            for k in ("loop_late_window", "loop_late_commit")
        ]
        lines.append(
            f"| {_agents(r)} | {_cell(r, 'processes')} | {r['backend']} | "
            f"{_cell(r, 'generation0_s', ' s')} | {_cell(r, 'requests_per_agent_s')} | "
            f"{_cell(r, 'bytes_per_agent_s')} | {_cell(r, 'store_server_cpu_pct', ' %')} "
            f"({_cell(r, 'store_server_cpu_pct_per_agent', ' %')}) | "
            f"{_cell(r, 'simulator_cpu_pct', ' %')} | {late[0]} / {late[1]} ms | "
            f"{_cell(r, 'detect_s', ' s')} | {_cell(r, 'last_left_after_declared_s', ' s')} | "
            f"{_cell(r, 'commit_after_declared_s', ' s')} | "
            f"{_cell(r, 'bytes_per_generation')} | "
            f"{_cell(r, 'load_before')} -> {_cell(r, 'load_after')} |"
        )
    lines += _spare_table([r for r in sims if _spares(r)])
    lines += [
        "",
        "| agents | store | `rtrain status` command | its reads alone | store calls "
        "| nodes shown live |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(data.get("real", []), key=lambda r: (r["nodes"], str(r["backend"]))):
        if "status_command_s" in r:
            lines.append(
                f"| {r['nodes']} | {r['backend']} | {_cell(r, 'status_command_s', ' s')} | "
                f"{_cell(r, 'status_reads_s', ' s')} | {_cell(r, 'status_store_calls')} | "
                f"{_cell(r, 'status_nodes_seen')} of {r['nodes']} |"
            )
    return "\n".join(lines)
