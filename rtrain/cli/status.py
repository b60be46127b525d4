"""`rtrain status`: a live view of a running job, read from its rendezvous store.

    rtrain status --rdzv-endpoint node0:29400 --rdzv-id job42
    rtrain status --rdzv-backend etcd --rdzv-endpoint e1:2379,e2:2379 --rdzv-id job42 --watch

shows the generation (or the round forming), every node with the age of its status
record, its workers and the step each last gave in a heartbeat, and the failures of
the last few generations. Read-only: it never writes to the store, so it cannot
disturb the job, and its requests are bounded (agent/observe/status_reader.py).
Exit 0; 1 with one line if the store holds no such job or garbage under its keys;
75 if the store does not answer (at once where its address refuses the connection: a
finished job's store is gone); 64 for a bad flag.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated, Any

import typer

from ..core.config.endpoints import parse_endpoint, parse_endpoints
from ..core.config.launch_spec import (
    DEFAULT_C10D_PORT,
    DEFAULT_ETCD_PORT,
    ETCD_BACKENDS,
    RdzvSpec,
)
from ..core.config.rdzv_conf import parse_rdzv_conf
from ..core.errors import RtrainError, StoreUnavailable, UsageError
from .render.safe_text import shown

BACKENDS = ("c10d", "static", *ETCD_BACKENDS)
Option = typer.Option


def status_command(
    rdzv_endpoint: Annotated[str, Option(help="The job's --rdzv-endpoint.")],
    rdzv_id: Annotated[str, Option(help="The job's --rdzv-id.")],
    rdzv_backend: Annotated[str, Option(help="c10d (TCPStore) or etcd.")] = "c10d",
    rdzv_conf: Annotated[str, Option(help="etcd TLS: protocol=https,cacert=...")] = "",
    as_json: Annotated[bool, Option("--json", help="Print the view as JSON.")] = False,
    watch: Annotated[bool, Option(help="Refresh every --interval seconds until Ctrl-C.")] = False,
    interval: Annotated[float, Option(help="Seconds between refreshes (--watch).")] = 2.0,
    timeout: Annotated[float, Option(help="Seconds to wait for the store.")] = 5.0,
) -> None:
    """Show a running job: generation, nodes, heartbeat steps per rank, failures so far."""
    try:
        code = run_status(
            rdzv_backend, rdzv_endpoint, rdzv_id, rdzv_conf, as_json, watch, interval, timeout
        )
    except RtrainError as exc:
        print(f"rtrain: error: {shown(exc, None)}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def rdzv_spec(backend: str, endpoint: str, run_id: str, conf_text: str, timeout: float) -> RdzvSpec:
    if backend not in BACKENDS:
        raise UsageError(f"--rdzv-backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if not run_id.strip():
        raise UsageError("--rdzv-id: empty")
    if not 0 < timeout <= 3600:
        raise UsageError(f"--timeout: {timeout:g} is not in (0, 3600] seconds")
    conf = parse_rdzv_conf(conf_text)
    if backend in ETCD_BACKENDS:
        endpoints = parse_endpoints(endpoint, DEFAULT_ETCD_PORT)
    else:
        endpoints = (parse_endpoint(endpoint, DEFAULT_C10D_PORT),)
    host, port = endpoints[0]
    return RdzvSpec(
        backend=backend,
        host=host,
        port=port,
        run_id=run_id,
        join_timeout=timeout,
        last_call_timeout=timeout,
        close_timeout=timeout,
        heartbeat_timeout=timeout,
        read_timeout=timeout,
        is_host=False,
        endpoints=endpoints,
        protocol=conf.get("protocol", "http"),
        cacert=conf.get("cacert"),
        cert=conf.get("cert"),
        key=conf.get("key"),
    )


def open_reader_store(rdzv: RdzvSpec) -> Any:
    """A client of the job's store that never hosts it: a status request must not
    start a store where the job's is gone. Over TCPStore, a client of its wire protocol
    that does not load torch (most of the command's time otherwise) where the installed
    torch is one it knows and the store answers its handshake; torch's client if not."""
    from ..agent.store.backends import open_etcd
    from ..agent.store.tcpstore_wire import (
        StoreUnreachable,
        TCPStoreReader,
        WireUnsupported,
        torch_version_supported,
    )

    if rdzv.is_etcd:
        return open_etcd(rdzv)
    if torch_version_supported():
        try:  # a refused connection is answered at once: no store is there to wait for
            return TCPStoreReader.connect(
                rdzv.host, rdzv.port, rdzv.read_timeout, retry_refused=False
            )
        except StoreUnreachable as exc:
            raise StoreUnavailable(
                f"no rendezvous store at {rdzv.host}:{rdzv.port}: {exc.reason}; the job has "
                "ended (its store ends with it) or has not started yet"
            ) from None
        except WireUnsupported:
            pass
    from ..agent.store.opening import connect_store
    from ..agent.store.torch_store import TorchKeyValueStore

    opened = connect_store(rdzv.host, rdzv.port, rdzv.read_timeout, rdzv.read_timeout)
    endpoint = f"{rdzv.host}:{rdzv.port}"
    return TorchKeyValueStore(opened.store, endpoint, rdzv.read_timeout, quiet_reads=True)


def run_status(
    backend: str,
    endpoint: str,
    run_id: str,
    conf: str,
    as_json: bool,
    watch: bool,
    interval: float,
    timeout: float,
) -> int:
    if watch and not 0.2 <= interval <= 3600:
        raise UsageError(f"--interval: {interval:g} is not in [0.2, 3600] seconds")
    rdzv = rdzv_spec(backend, endpoint, run_id, conf, timeout)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # one line, not a C++ trace
    from ..agent.observe.status_reader import read_status
    from .render.status import print_status, watch_status

    store = open_reader_store(rdzv)
    if watch:
        watch_status(lambda: read_status(store, run_id), interval, as_json)
        return 0
    started = time.monotonic()
    view = read_status(store, run_id)
    print_status(view, as_json, time.monotonic() - started)
    return 0
