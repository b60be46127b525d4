"""LaunchSpec validation: torchrun's implicit rules and every bad value."""

from __future__ import annotations

import signal

import pytest

from rtrain.cli.launch_args import parse_launch_args
from rtrain.core.config.launch_spec import build_launch_spec, resolve_nproc
from rtrain.core.config.worker_env import STDERR, STDOUT, stream_plan
from rtrain.core.errors import ExitCode, UsageError


def spec_of(*argv: str, env: dict[str, str] | None = None):
    return build_launch_spec(parse_launch_args(list(argv), env or {}))


def test_defaults_with_one_node_behave_as_standalone():
    spec = spec_of("train.py")
    assert spec.standalone and spec.rdzv.backend == "c10d" and spec.rdzv.port == 0
    assert spec.rdzv.run_id != "none"
    assert spec.nodes.min_nodes == spec.nodes.max_nodes == 1
    assert spec.shutdown_timeout == 30.0
    assert spec.signals_to_handle == (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
    )


def test_static_multi_node_uses_master_addr_and_port():
    spec = spec_of(
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "--master-port", "29555", "t.py"
    )
    assert (spec.rdzv.backend, spec.rdzv.host, spec.rdzv.port, spec.node_rank) == (
        "static",
        "h0",
        29555,
        1,
    )


def test_c10d_endpoint_default_port_and_conf():
    spec = spec_of(
        "--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head",
        "--rdzv-conf", "join_timeout=7,last_call_timeout=2,is_host=false", "t.py",
    )  # fmt: skip
    assert (spec.rdzv.host, spec.rdzv.port) == ("head", 29400)
    assert spec.rdzv.join_timeout == 7 and spec.rdzv.last_call_timeout == 2
    assert spec.rdzv.is_host is False
    assert spec.nodes.is_elastic and spec.node_rank is None


@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_etcd_endpoints_default_port_and_tls_conf(backend: str) -> None:
    spec = spec_of(
        "--nnodes", "2", "--rdzv-backend", backend,
        "--rdzv-endpoint", "e1,e2:2381,[::1]:2382",
        "--rdzv-conf", "protocol=https,cacert=/ca.pem,cert=/c.pem,key=/k.pem,timeout=9", "t.py",
    )  # fmt: skip
    assert spec.rdzv.is_etcd and spec.rdzv.backend == backend
    assert spec.rdzv.endpoints == (("e1", 2379), ("e2", 2381), ("::1", 2382))
    assert (spec.rdzv.host, spec.rdzv.port) == ("e1", 2379)
    assert (spec.rdzv.protocol, spec.rdzv.cacert, spec.rdzv.cert, spec.rdzv.key) == (
        "https", "/ca.pem", "/c.pem", "/k.pem",
    )  # fmt: skip
    assert spec.rdzv.join_timeout == 9  # torchrun's etcd name for it


def test_ipv6_endpoint():
    spec = spec_of(
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:1234", "--nnodes", "2", "t.py"
    )
    assert (spec.rdzv.host, spec.rdzv.port) == ("::1", 1234)


def test_entrypoint_kinds():
    assert spec_of("-m", "pkg.train", "a").entrypoint.kind == "module"
    assert spec_of("--no-python", "echo", "hi").entrypoint.args == ("hi",)
    assert spec_of("--run-path", "t.py").entrypoint.kind == "script"


def test_stream_maps_and_filter():
    spec = spec_of(
        "-r", "0:1,1:2", "-t", "2:3", "--local-ranks-filter", "0,2", "--nproc-per-node", "3", "t.py"
    )
    assert stream_plan(spec, 0).redirect == STDOUT and stream_plan(spec, 0).tee == 0
    # rank 1 is filtered off the console: both streams go to files only
    assert stream_plan(spec, 1).redirect == STDOUT | STDERR and stream_plan(spec, 1).tee == 0
    assert (
        stream_plan(spec, 2).redirect == STDOUT | STDERR
        and stream_plan(spec, 2).tee == STDOUT | STDERR
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "a:b", "t.py"], "--nnodes"),
        (["--nnodes", "3:2", "t.py"], "MIN must not exceed MAX"),
        (["--nnodes", "0", "t.py"], "at least 1"),
        (["--nnodes", "1:2:3", "t.py"], "--nnodes"),
        (["--nproc-per-node", "0", "t.py"], "--nproc-per-node"),
        (["--nproc-per-node", "many", "t.py"], "--nproc-per-node"),
        (["--rdzv-backend", "zookeeper", "t.py"], "unknown backend"),
        (["--rdzv-backend", "etcd", "t.py"], "needs --rdzv-endpoint"),
        (["--rdzv-backend", "etcd", "--rdzv-endpoint", "h:0", "t.py"], "real port"),
        (["--rdzv-backend", "etcd", "--rdzv-endpoint", "a:1,b:x", "t.py"], "port must be"),
        (["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", ",", "t.py"], "empty endpoint"),
        (
            ["--rdzv-backend=etcd", "--rdzv-endpoint=h", "--rdzv-conf=protocol=ftp", "t.py"],
            "http or https",
        ),
        (
            ["--rdzv-backend=etcd", "--rdzv-endpoint=h", "--rdzv-conf=key=k.pem", "t.py"],
            "needs cert",
        ),
        (
            ["--rdzv-backend=c10d", "--rdzv-endpoint=h", "--rdzv-conf=cacert=c", "t.py"],
            "for the etcd backends",
        ),
        (["--rdzv-backend", "c10d", "--nnodes", "2", "t.py"], "needs --rdzv-endpoint"),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:99999", "--nnodes", "2", "t.py"], "port"),
        (["--rdzv-conf", "join_timeout=-1", "t.py"], "positive"),
        (["--rdzv-conf", "bogus=1", "t.py"], "unknown key"),
        (["--rdzv-conf", "join_timeout", "t.py"], "key=value"),
        (["--max-restarts", "-1", "t.py"], "--max-restarts"),
        (["--monitor-interval", "0", "t.py"], "--monitor-interval"),
        (["--shutdown-timeout", "soon", "t.py"], "--shutdown-timeout"),
        (["-r", "7", "t.py"], "--redirects"),
        (["-t", "0:x", "t.py"], "--tee"),
        (["--local-ranks-filter", "a,b", "t.py"], "--local-ranks-filter"),
        (["--signals-to-handle", "SIGKILL", "t.py"], "--signals-to-handle"),
        (["--signals-to-handle", "SIGNOPE", "t.py"], "--signals-to-handle"),
        (["--nnodes", "2", "--node-rank", "2", "--master-port", "1", "t.py"], "out of range"),
        (["--nnodes", "1:2", "--master-port", "1", "t.py"], "fixed node count"),
        (["--standalone", "--nnodes", "2", "t.py"], "single node"),
        (["-m", "--no-python", "x"], "cannot be used together"),
        (["--preload", "not a module", "t.py"], "--preload"),
        (["--keep-checkpoints", "-1", "t.py"], "--keep-checkpoints"),
        ([], "missing the training script"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag(argv, message):
    with pytest.raises(UsageError, match=message) as info:
        spec_of(*argv)
    assert info.value.exit_code == ExitCode.USAGE
    assert "\n" not in str(info.value)


def test_resolve_nproc_keywords():
    assert resolve_nproc("auto", gpu_count=0, cpu_count=6) == 6
    assert resolve_nproc("auto", gpu_count=8, cpu_count=6) == 8
    assert resolve_nproc("cpu", gpu_count=8, cpu_count=6) == 6
    assert resolve_nproc("gpu", gpu_count=4, cpu_count=6) == 4
    with pytest.raises(UsageError, match="no visible GPU"):
        resolve_nproc("gpu", gpu_count=0, cpu_count=6)


def test_keep_checkpoints_defaults_to_a_few() -> None:
    assert spec_of("t.py").snapshots.keep_checkpoints == 3
    assert spec_of("--keep-checkpoints", "0", "t.py").snapshots.keep_checkpoints == 0
