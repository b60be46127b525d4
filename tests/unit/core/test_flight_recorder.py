"""torch's flight recorder in the workers' environment: on for GPU nodes (NCCL), its
dumps in each worker's log folder, the user's own settings kept, 0 turning it off."""

from __future__ import annotations

from rtrain.core.config.worker_env import (
    FLIGHT_RECORDER_PREFIX,
    NodeAssignment,
    flight_recorder_env,
    flight_recorder_named,
    flight_recorder_note,
    worker_environment,
)
from tests.unit.core.test_launch_spec import spec_of

ASSIGNMENT = NodeAssignment(
    generation=2,
    node_rank=1,
    num_nodes=2,
    local_world_size=1,
    rank_offset=1,
    world_size=2,
    master_addr="10.0.0.1",
    master_port=29500,
)
ERROR_FILE = "/logs/run/attempt_2/0/error.json"
RECORDER = {
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
}


def test_gpu_workers_get_the_recorder_with_dumps_in_their_log_folder() -> None:
    env = worker_environment(spec_of("t.py"), ASSIGNMENT, 0, ERROR_FILE, {}, flight_recorder=True)
    prefix = f"/logs/run/attempt_2/0/{FLIGHT_RECORDER_PREFIX}"
    assert {k: env[k] for k in RECORDER} == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


def test_cpu_workers_get_none_of_it_as_under_torchrun() -> None:
    env = worker_environment(spec_of("t.py"), ASSIGNMENT, 0, ERROR_FILE, {"PATH": "/bin"})
    assert not RECORDER & set(env)


def test_the_users_settings_win_and_a_size_of_zero_turns_it_off() -> None:
    assert flight_recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, "/l") == {}
    assert flight_recorder_env({"TORCH_FR_BUFFER_SIZE": "500"}, "/l") == {}
    mine = flight_recorder_env({"TORCH_FR_DUMP_TEMP_FILE": "/shared/fr_"}, "/l")
    assert "TORCH_FR_DUMP_TEMP_FILE" not in mine
    assert mine["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"/l/{FLIGHT_RECORDER_PREFIX}"
    off = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    env = worker_environment(spec_of("t.py"), ASSIGNMENT, 0, ERROR_FILE, off, flight_recorder=True)
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"


def test_a_failure_names_its_dumps_and_the_report_reads_them_back() -> None:
    dumps = ["/l/a/nccl_trace_rank_0", "/l/b/nccl_trace_rank_1"]
    message = f"exit 3 {flight_recorder_note(dumps)}"
    assert message == "exit 3 (flight recorder: /l/a/nccl_trace_rank_0, /l/b/nccl_trace_rank_1)"
    assert flight_recorder_named(message) == dumps
    assert flight_recorder_note([]) == "" and flight_recorder_named("exit 3 (x)") == []
