"""What a launch says first, so that a user can find the job again: its run id and log
folder (cli/main.py, once the agent made the folder), and, once the store answered,
its address and the exact `rtrain status` command that reaches it (every node says so:
the store's port is known only then, for --standalone a free one)."""

from __future__ import annotations

import logging
import shlex

from ...core.config.launch_spec import RdzvSpec

logger = logging.getLogger(__name__)


def endpoint_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def status_command(rdzv: RdzvSpec, port: int) -> str:
    """The `rtrain status` command line that reaches this job (port: the store's own,
    which is not rdzv.port where that was 0)."""
    if rdzv.is_etcd:
        members = ",".join(endpoint_text(h, p) for h, p in rdzv.endpoints)
        words = ["rtrain", "status", "--rdzv-backend", "etcd", "--rdzv-endpoint", members]
        conf = [
            f"{key}={value}"
            for key, value in (
                ("protocol", rdzv.protocol if rdzv.protocol != "http" else None),
                ("cacert", rdzv.cacert),
                ("cert", rdzv.cert),
                ("key", rdzv.key),
            )
            if value
        ]
        if conf:
            words += ["--rdzv-conf", ",".join(conf)]
    else:
        words = ["rtrain", "status", "--rdzv-endpoint", endpoint_text(rdzv.host, port)]
    return shlex.join([*words, "--rdzv-id", rdzv.run_id])


def announce_store(rdzv: RdzvSpec, port: int, hosted: bool) -> None:
    where = (
        ",".join(endpoint_text(h, p) for h, p in rdzv.endpoints)
        if rdzv.is_etcd
        else endpoint_text(rdzv.host, port)
    )
    kind = "etcd" if rdzv.is_etcd else "TCPStore, hosted here" if hosted else "TCPStore"
    logger.info(
        "run %s: rendezvous store %s (%s); see the job with: %s",
        rdzv.run_id,
        where,
        kind,
        status_command(rdzv, port),
    )
