"""Choosing the store: what --rdzv-backend opens, and what it refuses before any
request (TLS files that do not load); the interrupt that keeps an etcd wait
responsive to signals fires once, so the shutdown that follows can still use etcd."""

from __future__ import annotations

import pytest

from rtrain.agent.store.backends import _once, open_etcd, open_job_store
from rtrain.agent.store.torch_store import TorchKeyValueStore
from rtrain.core.errors import RendezvousError

from .fakes import launch_spec


def test_tls_files_that_do_not_load_are_one_clear_error(tmp_path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    spec = launch_spec(
        "--rdzv-backend=etcd", "--rdzv-endpoint=127.0.0.1:1",
        f"--rdzv-conf=protocol=https,cacert={bad}",
    )  # fmt: skip
    with pytest.raises(RendezvousError, match="cacert/cert/key: cannot load them"):
        open_etcd(spec.rdzv)


def test_an_etcd_endpoint_that_refuses_connections_is_unavailable_after_the_deadline() -> None:
    spec = launch_spec(
        "--rdzv-backend=etcd", "--rdzv-endpoint=127.0.0.1:1,127.0.0.1:2",
        "--rdzv-conf=join_timeout=0.3",
    )  # fmt: skip
    with pytest.raises(RendezvousError, match=r"none of 127.0.0.1:1,127.0.0.1:2 answered"):
        open_job_store(spec.rdzv, None, lambda: None)


def test_the_interrupt_fires_once() -> None:
    calls = []

    def interrupt() -> None:
        calls.append(1)
        raise KeyboardInterrupt

    check = _once(interrupt)
    assert check is not None
    with pytest.raises(KeyboardInterrupt):
        check()
    check()  # the shutdown's own store calls are not interrupted again
    assert calls == [1] and _once(None) is None


def test_c10d_opens_a_torch_store_that_this_node_hosts() -> None:
    spec = launch_spec("--standalone")
    job_store = open_job_store(spec.rdzv, None, lambda: None)
    assert isinstance(job_store.kv, TorchKeyValueStore) and job_store.is_host
    assert job_store.connect is not None and job_store.connect().exists("nothing") is False
