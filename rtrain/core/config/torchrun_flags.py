"""torchrun's flags, as torchrun spells them, with rtrain's checks: the first part of
the settings table (core/config/settings.py holds rtrain's own flags and the whole).
Flags torchrun has that rtrain does not act on are here too (acted_on=False). Pure data.
"""

from __future__ import annotations

from .checks import (
    BACKEND,
    CHOICE,
    COUNT,
    ENDPOINTS,
    NODES,
    NPROC,
    PORT,
    RANKS,
    RDZV_CONF,
    SECONDS,
    SIGNALS,
    STREAMS,
    SWITCH,
    TEXT,
    optional,
    or_default,
)
from .endpoints import DEFAULT_MASTER_PORT
from .rdzv_conf import RDZV_CONF_DEFAULTS
from .setting_row import Setting

S = Setting
TORCHRUN_SETTINGS: tuple[Setting, ...] = (
    S(
        "nnodes",
        "1:1",
        "number of nodes, N or MIN:MAX (elastic)",
        "N",
        underscore=False,
        check=NODES,
    ),
    S("nproc-per-node", "1", "workers per node: an integer, auto, cpu or gpu", "N", check=NPROC),
    S(
        "rdzv-backend",
        "static",
        "rendezvous backend: static, c10d (a TCPStore on one node) or etcd / etcd-v2 "
        "(an etcd v3 cluster)",
        "NAME",
        check=BACKEND,
    ),
    S(
        "rdzv-endpoint",
        "",
        "rendezvous store HOST[:PORT] (c10d port 29400); etcd: HOST[:PORT],... "
        "(port 2379), every member",
        "HOST:PORT",
        check=ENDPOINTS,
        shown="none (static: --master-addr:--master-port)",
    ),
    S("rdzv-id", "none", "job id shared by all nodes", "ID", check=or_default(TEXT)),
    S(
        "rdzv-conf",
        "",
        "k=v,... join_timeout, last_call_timeout, close_timeout, heartbeat_timeout, "
        "read_timeout (seconds), is_host; etcd: protocol=https, cacert, cert, key "
        "(files), timeout (= join_timeout)",
        "K=V,...",
        check=RDZV_CONF,
        shown=", ".join(f"{k}={v:g}" for k, v in RDZV_CONF_DEFAULTS.items())
        + ", is_host: the node that owns the endpoint",
    ),
    S(
        "standalone",
        False,
        "single node: a local store on a free port, a random job id",
        switch=True,
        underscore=False,
        check=SWITCH,
    ),
    S("max-restarts", 0, "restarts of the worker group allowed after a failure", "N", check=COUNT),
    S("monitor-interval", 0.1, "seconds between checks of the workers", "S", check=SECONDS),
    S(
        "start-method",
        None,
        "spawn: every worker a fresh interpreter, as torchrun starts it (import-time "
        "settings are the script's; a restart imports torch again); fork, forkserver or "
        "unset: workers forked from rtrain's preloaded pool",
        "METHOD",
        choices=("spawn", "fork", "forkserver"),
        check=optional(CHOICE),
    ),
    S("event-log-handler", "null", "", "NAME", acted_on=False, check=TEXT),
    S(
        "role",
        "default",
        "role name of the workers (ROLE_NAME)",
        "NAME",
        underscore=False,
        check=or_default(TEXT),
    ),
    S(
        "module",
        False,
        "run the entry point as a module, like python -m",
        switch=True,
        short="-m",
        underscore=False,
        check=SWITCH,
    ),
    S(
        "no-python",
        False,
        "execute the entry point directly, without python",
        switch=True,
        check=SWITCH,
    ),
    S(
        "run-path",
        False,
        "run the script with runpy.run_path (what rtrain always does)",
        switch=True,
        check=SWITCH,
    ),
    S(
        "log-dir",
        None,
        "base folder for workers' logs (default: a temp folder)",
        "DIR",
        check=optional(TEXT),
    ),
    S(
        "redirects",
        "0",
        "streams to files: 0-3 (1 out, 2 err) or 0:1,1:2",
        "MAP",
        short="-r",
        underscore=False,
        check=STREAMS,
    ),
    S(
        "tee",
        "0",
        "streams to files and console with a [roleRANK]: prefix",
        "MAP",
        short="-t",
        underscore=False,
        check=STREAMS,
    ),
    S(
        "local-ranks-filter",
        "",
        "console output only from these local ranks",
        "RANKS",
        check=RANKS,
        shown="every rank",
    ),
    S("duplicate-stdout-filters", "", "", "FILTERS", acted_on=False, check=TEXT),
    S("duplicate-stderr-filters", "", "", "FILTERS", acted_on=False, check=TEXT),
    S("node-rank", 0, "this node's rank (static backend)", "N", check=COUNT),
    S(
        "master-addr",
        "127.0.0.1",
        "static backend: node 0's address",
        "HOST",
        check=or_default(TEXT),
    ),
    S(
        "master-port",
        None,
        "static backend: the rendezvous port on node 0",
        "PORT",
        check=optional(PORT, (None,)),
        shown=str(DEFAULT_MASTER_PORT),
    ),
    S(
        "local-addr",
        None,
        "this node's address as peers reach it (default FQDN)",
        "HOST",
        check=optional(TEXT),
    ),
    S("logs-specs", None, "", "NAME", acted_on=False, check=optional(TEXT)),
    S("numa-binding", None, "", "NAME", acted_on=False, check=optional(TEXT)),
    S(
        "signals-to-handle",
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "signals rtrain forwards to the workers before exiting",
        "SIGNALS",
        check=or_default(SIGNALS),
    ),
    S(
        "shutdown-timeout",
        None,
        "seconds between forwarding a signal and SIGKILL (default 30)",
        "S",
        check=optional(SECONDS, (None,)),
    ),
    S(
        "virtual-local-rank",
        False,
        "LOCAL_RANK=0 and one GPU visible per worker",
        switch=True,
        check=SWITCH,
    ),
)
del S
