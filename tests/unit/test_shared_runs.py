"""tests/integration/shared_runs.py on an inner test run of two xdist workers: a
reference run asked for by a test on each worker is made once, and both read it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SHARED_RUNS = (Path(__file__).parents[1] / "integration" / "shared_runs.py").read_text()

ASKING = """
import os, pathlib, time

import pytest
from shared_runs import once_per_run

def produce(tmp):
    with open(pathlib.Path(__file__).parent / "produced", "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    time.sleep(1)  # long enough that the other worker asks while this one runs
    return {"1": str(tmp.name)}

def test_asks_{name}(tmp_path_factory):
    pathlib.Path("{name}_worker").write_text(os.environ["PYTEST_XDIST_WORKER"])
    value = once_per_run(tmp_path_factory, "ref", produce)
    assert list(value) == ["1"] and value["1"].startswith("ref")
    pathlib.Path("{name}_value").write_text(value["1"])
"""


def test_a_reference_asked_for_on_two_workers_is_made_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        shared_runs=SHARED_RUNS,
        test_a=ASKING.replace("{name}", "a"),
        test_b=ASKING.replace("{name}", "b"),
    )
    args = ["-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"]
    result = pytester.runpytest_subprocess(*args, timeout=120)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    workers = {(pytester.path / f"{name}_worker").read_text() for name in "ab"}
    assert len(workers) == 2  # one file on each worker
    assert len((pytester.path / "produced").read_text().split()) == 1
    values = {(pytester.path / f"{name}_value").read_text() for name in "ab"}
    assert len(values) == 1  # both read the one run's result
