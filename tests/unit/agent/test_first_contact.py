"""The `rtrain status` command a launch prints: it parses back to the job's store."""

from __future__ import annotations

import shlex

from rtrain.agent.observe.first_contact import status_command
from rtrain.cli.status import rdzv_spec

from .fakes import launch_spec


def _reparsed(command: str) -> dict[str, str]:
    words = shlex.split(command)
    assert words[:2] == ["rtrain", "status"]
    return dict(zip(words[2::2], words[3::2], strict=True))


def test_c10d_names_the_store_with_the_port_it_got() -> None:
    spec = launch_spec("--standalone")  # port 0 until the store is up
    flags = _reparsed(status_command(spec.rdzv, 40123))
    assert flags == {"--rdzv-endpoint": "127.0.0.1:40123", "--rdzv-id": spec.rdzv.run_id}


def test_etcd_names_every_member_and_the_tls_files() -> None:
    spec = launch_spec(
        "--nnodes=2",
        "--rdzv-backend=etcd",
        "--rdzv-endpoint=e1:2379,[::1]:2380",
        "--rdzv-id=my job; rm -rf",
        "--rdzv-conf=protocol=https,cacert=/etc/ca dir/ca.pem",
    )
    flags = _reparsed(status_command(spec.rdzv, spec.rdzv.port))
    assert flags == {
        "--rdzv-backend": "etcd",
        "--rdzv-endpoint": "e1:2379,[::1]:2380",
        "--rdzv-conf": "protocol=https,cacert=/etc/ca dir/ca.pem",
        "--rdzv-id": "my job; rm -rf",
    }
    parsed = rdzv_spec(
        "etcd", flags["--rdzv-endpoint"], flags["--rdzv-id"], flags["--rdzv-conf"], 5
    )
    assert parsed.endpoints == spec.rdzv.endpoints and parsed.cacert == spec.rdzv.cacert
