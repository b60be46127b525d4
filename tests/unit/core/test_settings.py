"""The settings table (core/config/settings.py) is the one source of the flags: the
parser, the spec's defaults and the docs all come from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rtrain.cli.launch_args import build_parser, parse_launch_args
from rtrain.core.config.launch_spec import FaultSpec, HealthSpec, SnapshotSpec, build_launch_spec
from rtrain.core.config.settings import SETTINGS, default
from rtrain.core.errors import ExitCode, UsageError

ROOT = Path(__file__).resolve().parents[3]


def test_every_setting_is_a_flag_with_the_table_default() -> None:
    raw = parse_launch_args(["train.py"], {})
    for setting in SETTINGS:
        assert raw[setting.dest] == setting.default, setting.name
    known = {a.dest for a in build_parser({})._actions} - {"help"}
    assert known == {s.dest for s in SETTINGS} | {"training_script", "training_script_args"}


@pytest.mark.parametrize("setting", [s for s in SETTINGS if not s.switch], ids=lambda s: s.name)
def test_every_spelling_and_the_environment_reach_the_same_dest(setting) -> None:
    value = setting.choices[1] if setting.choices else "7"
    for flag in setting.flags:
        assert parse_launch_args([flag, value, "train.py"], {})[setting.dest] == value, flag
    from_env = parse_launch_args(["train.py"], {setting.env: value})
    assert from_env[setting.dest] == value and setting.dest in from_env["explicit"]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_every_setting_checks_its_value_and_refuses_a_bad_one_naming_the_flag(setting) -> None:
    assert setting.check is not None, f"{setting.flag}: no check (core/config/checks.py)"
    setting.parse(setting.default)  # the table's default passes its own check
    bad = setting.check.bad
    tries = [lambda: build_launch_spec({"training_script": "train.py", setting.dest: bad})]
    if not setting.switch:  # a switch takes no value on the command line or in PET_*
        tries.append(lambda: spec_from([setting.flag, bad, "train.py"], {}))
        tries.append(lambda: spec_from(["train.py"], {setting.env: bad}))
    for attempt in tries:
        with pytest.raises(UsageError) as info:
            attempt()
        message = str(info.value)
        assert setting.flag in message and "\n" not in message, message
        assert info.value.exit_code == ExitCode.USAGE


def spec_from(argv: list[str], environ: dict[str, str]) -> object:
    return build_launch_spec(parse_launch_args(argv, environ))


def test_a_spec_built_from_nothing_but_the_script_takes_the_table_defaults() -> None:
    spec = build_launch_spec({"training_script": "train.py"})
    assert spec.max_restarts == default("max-restarts")
    assert spec.monitor_interval == default("monitor-interval")
    assert spec.preload == (default("preload"),)
    assert spec.faults == FaultSpec() and spec.snapshots == SnapshotSpec()
    assert spec.health == HealthSpec()
    assert FaultSpec().hang_timeout == default("hang-timeout")
    assert HealthSpec().interval == default("health-interval")
    assert SnapshotSpec().copies == default("snapshot-copies")


def test_the_flag_reference_page_is_the_settings_table() -> None:
    """docs/flags.md, the documentation site's flag reference, is generated from the
    table: a flag added, renamed or given another default there and not on the page
    fails here. README.md links to the page and carries no table of its own."""
    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts/settings_doc.py")
    assert spec is not None and spec.loader is not None
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    assert doc.stale() == [], "run scripts/settings_doc.py"
    page = (ROOT / "docs" / "flags.md").read_text()
    assert all(f"`--{s.name}" in page for s in SETTINGS)
    assert "<!-- settings: own -->" not in (ROOT / "README.md").read_text()
