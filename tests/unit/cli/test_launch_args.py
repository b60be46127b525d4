"""Flag parsing: every torchrun flag, its underscore alias and its PET_ default."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtrain.cli.launch_args import build_parser, launch_help, parse_launch_args
from rtrain.core.config.settings import SETTINGS
from rtrain.core.errors import UsageError

# (dashed flag, value, dest, expected parsed value)
VALUED_FLAGS = [
    ("--nnodes", "2:4", "nnodes", "2:4"),
    ("--nproc-per-node", "4", "nproc_per_node", "4"),
    ("--rdzv-backend", "c10d", "rdzv_backend", "c10d"),
    ("--rdzv-endpoint", "h:1234", "rdzv_endpoint", "h:1234"),
    ("--rdzv-id", "job7", "rdzv_id", "job7"),
    ("--rdzv-conf", "join_timeout=5", "rdzv_conf", "join_timeout=5"),
    ("--max-restarts", "3", "max_restarts", "3"),
    ("--monitor-interval", "0.5", "monitor_interval", "0.5"),
    ("--start-method", "fork", "start_method", "fork"),
    ("--event-log-handler", "console", "event_log_handler", "console"),
    ("--role", "trainer", "role", "trainer"),
    ("--log-dir", "/tmp/x", "log_dir", "/tmp/x"),
    ("--redirects", "3", "redirects", "3"),
    ("--tee", "0:1", "tee", "0:1"),
    ("--local-ranks-filter", "0,1", "local_ranks_filter", "0,1"),
    ("--node-rank", "1", "node_rank", "1"),
    ("--master-addr", "10.0.0.1", "master_addr", "10.0.0.1"),
    ("--master-port", "1234", "master_port", "1234"),
    ("--local-addr", "n1", "local_addr", "n1"),
    ("--signals-to-handle", "SIGTERM", "signals_to_handle", "SIGTERM"),
    ("--shutdown-timeout", "7", "shutdown_timeout", "7"),
    ("--preload", "none", "preload", "none"),
]
SWITCHES = [
    ("--standalone", "standalone"),
    ("--module", "module"),
    ("--no-python", "no_python"),
    ("--run-path", "run_path"),
    ("--virtual-local-rank", "virtual_local_rank"),
    ("--dry-run", "dry_run"),
]


@pytest.mark.parametrize(("flag", "value", "dest", "expected"), VALUED_FLAGS)
def test_dashed_underscore_and_env_spellings_agree(flag, value, dest, expected):
    dashed = parse_launch_args([flag, value, "train.py"], {})
    underscore = parse_launch_args(
        [flag.replace("-", "_").replace("__", "--", 1), value, "t.py"], {}
    )
    from_env = parse_launch_args(["train.py"], {f"PET_{dest.upper()}": value})
    assert dashed[dest] == underscore[dest] == from_env[dest] == expected


@pytest.mark.parametrize(("flag", "dest"), SWITCHES)
def test_switches_from_flag_and_env(flag, dest):
    assert parse_launch_args([flag, "train.py"], {})[dest] is True
    assert parse_launch_args(["train.py"], {})[dest] is False
    assert parse_launch_args(["train.py"], {f"PET_{dest.upper()}": "1"})[dest] is True
    assert parse_launch_args(["train.py"], {f"PET_{dest.upper()}": "0"})[dest] is False


def test_flag_beats_environment():
    raw = parse_launch_args(["--nnodes", "3", "train.py"], {"PET_NNODES": "2"})
    assert raw["nnodes"] == "3"


def test_short_flags_and_equals_form():
    raw = parse_launch_args(["-m", "-r", "1", "-t", "2", "--nproc-per-node=2", "pkg.mod"], {})
    assert (raw["module"], raw["redirects"], raw["tee"], raw["nproc_per_node"]) == (
        True,
        "1",
        "2",
        "2",
    )


def test_everything_after_the_script_belongs_to_the_script():
    raw = parse_launch_args(["--nnodes", "1", "train.py", "--nnodes", "9", "-m", "x"], {})
    assert raw["training_script"] == "train.py"
    assert raw["training_script_args"] == ["--nnodes", "9", "-m", "x"]
    assert raw["nnodes"] == "1"


def test_unknown_flag_is_a_usage_error():
    with pytest.raises(UsageError, match="unrecognized arguments"):
        parse_launch_args(["--no-such-flag", "train.py"], {})


def test_bad_choice_is_a_usage_error():
    with pytest.raises(UsageError, match="start-method"):
        parse_launch_args(["--start-method", "teleport", "train.py"], {})


def test_flags_not_acted_on_are_reported_and_documented():
    raw = parse_launch_args(["--logs-specs", "x", "--numa-binding", "node", "t.py"], {})
    assert raw["ignored_flags"] == ("--logs-specs", "--numa-binding")
    assert parse_launch_args(["t.py"], {})["ignored_flags"] == ()
    text = " ".join(launch_help({}).split())
    for flag in ("--event-log-handler", "--logs-specs", "--numa-binding"):
        section = text[text.rindex(flag) :][:300]
        assert "not acted on" in section, flag


def test_dry_run_shows_the_layout_grid_and_fault_settings(capsys):
    from rtrain.cli.main import run_launch

    argv = [
        "--dry-run",
        "--nnodes=2",
        "--nproc-per-node=4",
        "--tp=2",
        "--pp=2",
        "--hang-timeout=30",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=head:29400",
        "examples/train_mlp.py",
    ]
    # a node whose NVML answers (a fake one): the checks it promises are run
    healthy = Path(__file__).parents[2] / "scenarios" / "healthy_8gpu.json"
    assert run_launch(argv, {"RTRAIN_FAKE_NVML": str(healthy)}) == 0
    out = capsys.readouterr().out
    assert "DP=2 x PP=2 x TP=2 over 2 nodes" in out
    assert "30s after a worker's first heartbeat()" in out
    assert "every check every 10s, XIDs at once" in out
    rows = [line for line in out.splitlines() if line.startswith("│") and "│" in line[1:]]
    grid = [[cell.strip() for cell in row.strip("│").split("│")] for row in rows]
    # rank 5: node 1, second replica, first stage, TP rank 1; TP group 4,5; DP peers 1,5
    assert ["5", "1", "1", "0", "1", "4,5", "1,5"] in grid


def test_help_shows_every_default():
    """Issue 31: `rtrain launch --help` left most defaults unsaid."""
    parser = build_parser({})
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) == len(SETTINGS)
    for action in flags:
        assert "default" in (action.help or ""), action.option_strings
    text = " ".join(launch_help({}).split())
    for shown in (
        "--nnodes N number of nodes, N or MIN:MAX (elastic) (default: 1:1)",
        "(default: join_timeout=600, last_call_timeout=30, close_timeout=30,",
        "(default: 29500)",
        "(default: off)",
        "(default: 60.0)",
    ):
        assert shown in text, shown
