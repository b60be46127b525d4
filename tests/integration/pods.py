"""Kubernetes pods emulated on one machine, for tests without a cluster.

Each pod is a network namespace of its own (`ip netns`), joined to the others through
a veth pair on a bridge in a cluster namespace, so a pod owns only its address (a
10.x one that exists only here: a loopback store address would hide the defects of
resolving names). Its process runs in a UTS and mount namespace of its own with the
pod's hostname and a kubelet-style /etc/hosts (`ip netns exec` binds
/etc/netns/<ns>/hosts over /etc/hosts): the kubelet's line for the pod itself, then
the headless service's DNS records, one line a pod, rewritten in place when a pod is
replaced at a new address (the same name, as Kubernetes keeps it).

The environment each controller sets is in `controller_env` (Trainer v2, PyTorchJob
static and elastic, JobSet, Volcano), so a test runs exactly what a pod gets.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip`/`unshare`: `unavailable()`
says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NETNS_DIR = Path("/etc/netns")
SUBNET = "10.244"  # the pods' addresses: 10.244.<cluster>.<n>/16
CLUSTER_DOMAIN = "cluster.local"
NAMESPACE = "default"
_unavailable: str | None = None
_probed = False


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def unavailable() -> str | None:
    """Why pods cannot be emulated here (for pytest.skip), or None."""
    global _unavailable, _probed
    if _probed:
        return _unavailable
    _probed = True
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            _unavailable = f"no `{tool}` on this machine"
            return _unavailable
    probe = f"rt-probe-{os.getpid()}"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            _unavailable = f"`ip netns add` is not allowed here ({made.stderr.strip()})"
            return _unavailable
        test = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "--uts", "--mount", "true"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if test.returncode != 0:
            _unavailable = f"`unshare --uts --mount` is not allowed here ({test.stderr.strip()})"
    except (OSError, subprocess.SubprocessError) as exc:
        _unavailable = f"network namespaces are not available here ({exc})"
    finally:
        _ip("netns", "del", probe, check=False)
    return _unavailable


@dataclass
class Pod:
    name: str  # the pod's hostname, e.g. tj-node-0-0
    subdomain: str | None  # the headless service, e.g. tj; None: a Service of its own name
    address: str
    netns: str
    veth: str
    proc: subprocess.Popen[str] | None = None
    log: Path | None = None

    @property
    def fqdn(self) -> str:
        parts = [self.name, self.subdomain] if self.subdomain else [self.name]
        return ".".join([*parts, NAMESPACE, "svc", CLUSTER_DOMAIN])

    def dns_names(self) -> list[str]:
        """The names the cluster's DNS answers for this pod (the search path's too)."""
        if self.subdomain:
            return [self.fqdn, f"{self.name}.{self.subdomain}"]
        return [self.fqdn, self.name]

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)


@dataclass
class Cluster:
    """A bridge in a namespace of its own, and the pods on it."""

    folder: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    pods: list[Pod] = field(default_factory=list)
    late: set[str] = field(default_factory=set)  # pods whose DNS records are not out yet
    _next: int = 1

    @property
    def bridge_ns(self) -> str:
        return f"rt-{self.tag}-br"

    def start(self) -> None:
        _ip("netns", "add", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        _ip("-n", self.bridge_ns, "link", "set", "lo", "up")

    def add_pod(self, name: str, subdomain: str | None, dns_late: bool = False) -> Pod:
        """A new pod (a replacement keeps the name and gets a new address)."""
        index = self._next
        self._next += 1
        netns, veth = f"rt-{self.tag}-{index}", f"rt{self.tag}{index}"
        address = f"{SUBNET}.{index // 250}.{index % 250 + 1}"
        pod = Pod(name, subdomain, address, netns, veth)
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _ip("link", "set", veth, "netns", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "set", veth, "master", "br0")
        _ip("-n", self.bridge_ns, "link", "set", veth, "up")
        _ip("link", "set", f"{veth}p", "netns", netns)
        _ip("-n", netns, "link", "set", f"{veth}p", "name", "eth0")
        _ip("-n", netns, "addr", "add", f"{address}/16", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        (NETNS_DIR / netns).mkdir(parents=True, exist_ok=True)
        self.pods = [p for p in self.pods if p.name != name] + [pod]
        if dns_late:
            self.late.add(name)
        self.write_dns()
        return pod

    def publish(self, name: str) -> None:
        """The late pod's DNS records appear."""
        self.late.discard(name)
        self.write_dns()

    def write_dns(self) -> None:
        """Every pod's /etc/hosts: the kubelet's lines, then the cluster's DNS records
        (rewritten in place: the file a running pod has bound stays the same file)."""
        records = [
            f"{p.address}\t{' '.join(p.dns_names())}" for p in self.pods if p.name not in self.late
        ]
        for pod in self.pods:
            own = pod.fqdn if pod.subdomain else pod.name
            text = (
                "# Kubernetes-managed hosts file.\n"
                "127.0.0.1\tlocalhost\n"
                "::1\tlocalhost ip6-localhost ip6-loopback\n"
                f"{pod.address}\t{own}\t{pod.name}\n"
                "# the cluster's DNS (emulated)\n" + "\n".join(records) + "\n"
            )
            hosts = NETNS_DIR / pod.netns / "hosts"
            with open(hosts, "a+") as handle:  # same inode: a running pod sees the change
                handle.seek(0)
                handle.truncate()
                handle.write(text)

    def run(
        self,
        pod: Pod,
        command: Sequence[str],
        env: Mapping[str, str],
        shm_bytes: int | None = None,
        cwd: Path | None = None,
    ) -> Pod:
        """Start `command` as the pod's container: its hostname, its /etc/hosts, and
        with shm_bytes a tmpfs of that size at /dev/shm (a container's default is 64 MiB)."""
        setup = f'hostname "{pod.name}"'
        if shm_bytes is not None:
            setup += f" && mount -t tmpfs -o size={shm_bytes} tmpfs /dev/shm"
        pod.log = self.folder / f"{pod.netns}.log"
        # ip netns exec: the network and the hosts file; unshare: hostname and /dev/shm
        netns = ["ip", "netns", "exec", pod.netns]
        private = ["unshare", "--uts", "--mount", "--propagation", "private"]
        shell = ["sh", "-c", f'{setup} && exec "$@"', "pod"]
        with open(pod.log, "w") as handle:
            pod.proc = subprocess.Popen(
                [*netns, *private, *shell, *command],
                env=dict(env),
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                cwd=cwd,
            )
        return pod

    def remove(self, pod: Pod, sig: int = signal.SIGKILL) -> None:
        """The pod is gone: its process killed, its address with it (its DNS record
        stays until a replacement takes the name)."""
        if pod.proc is not None and pod.proc.poll() is None:
            pod.signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.proc.wait(timeout=10)
        _ip("netns", "del", pod.netns, check=False)

    def close(self) -> None:
        for pod in self.pods:
            self.remove(pod)
            shutil.rmtree(NETNS_DIR / pod.netns, ignore_errors=True)
        _ip("netns", "del", self.bridge_ns, check=False)
        for entry in NETNS_DIR.glob(f"rt-{self.tag}-*"):
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def cluster(folder: Path) -> Iterator[Cluster]:
    made = Cluster(folder)
    made.start()
    try:
        yield made
    finally:
        made.close()


@dataclass(frozen=True)
class Controller:
    """What one controller gives a pod: its name, subdomain and environment."""

    kind: str
    job: str
    nodes: int  # pods
    port: int
    elastic: tuple[int, int] | None = None

    def pod_name(self, index: int) -> tuple[str, str | None]:
        if self.kind in ("trainer-v2", "jobset"):
            return f"{self.job}-node-0-{index}", self.job
        if self.kind == "volcano":
            task = "master" if index == 0 else "worker"
            return f"{self.job}-{task}-{0 if index == 0 else index - 1}", self.job
        if self.kind == "pytorchjob-elastic":
            return f"{self.job}-worker-{index}", None
        task = "master" if index == 0 else "worker"  # pytorchjob: a Service a pod
        return f"{self.job}-{task}-{0 if index == 0 else index - 1}", None

    def env(self, index: int, nproc: int) -> dict[str, str]:
        """Exactly the variables the controller sets (and nothing it does not)."""
        kube = {
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
            "HOSTNAME": self.pod_name(index)[0],
        }
        if self.kind == "trainer-v2":  # kubeflow/trainer's torch plugin on a JobSet
            return {
                **kube,
                **_jobset(self.job, "node", index),
                "PET_NNODES": str(self.nodes),
                "PET_NPROC_PER_NODE": str(nproc),
                "PET_NODE_RANK": str(index),  # from JOB_COMPLETION_INDEX
                "PET_MASTER_ADDR": f"{self.job}-node-0-0.{self.job}",
                "PET_MASTER_PORT": str(self.port),
            }
        if self.kind == "jobset":  # a JobSet whose command maps its index itself
            return {**kube, **_jobset(self.job, "node", index)}
        if self.kind == "pytorchjob":  # training-operator v1, Master + Worker
            return {
                **kube,
                "PYTHONUNBUFFERED": "0",
                "MASTER_PORT": str(self.port),
                "MASTER_ADDR": f"{self.job}-master-0",
                "WORLD_SIZE": str(self.nodes),
                "RANK": str(index),
            }
        if self.kind == "pytorchjob-elastic":  # elasticPolicy, Workers only
            low, high = self.elastic or (self.nodes, self.nodes)
            return {
                **kube,
                "PYTHONUNBUFFERED": "0",
                "PET_RDZV_ENDPOINT": f"{self.job}-worker-0:{self.port}",
                "PET_RDZV_BACKEND": "c10d",
                "PET_NNODES": f"{low}:{high}",
                "PET_NPROC_PER_NODE": str(nproc),
                "PET_RDZV_ID": self.job,
            }
        if self.kind == "volcano":  # Volcano's pytorch plugin (and svc, which it forces)
            workers = ",".join(f"{self.job}-worker-{i}.{self.job}" for i in range(self.nodes - 1))
            return {
                **kube,
                "MASTER_ADDR": f"{self.job}-master-0.{self.job}",
                "MASTER_PORT": str(self.port),
                "WORLD_SIZE": str(self.nodes),
                "RANK": str(index),
                "VC_MASTER_HOSTS": f"{self.job}-master-0.{self.job}",
                "VC_MASTER_NUM": "1",
                "VC_WORKER_HOSTS": workers,
                "VC_WORKER_NUM": str(self.nodes - 1),
                "VC_TASK_INDEX": str(0 if index == 0 else index - 1),
            }
        raise ValueError(self.kind)


def _jobset(job: str, replicated: str, index: int) -> dict[str, str]:
    return {
        "JOBSET_NAME": job,
        "REPLICATED_JOB_NAME": replicated,
        "JOB_INDEX": "0",
        "JOB_COMPLETION_INDEX": str(index),
        "JOB_GLOBAL_INDEX": "0",
    }


def base_env(extra: Mapping[str, str]) -> dict[str, str]:
    """What the container image brings (PATH, Python's), without this machine's PET_*,
    MASTER_* or Kubernetes variables: the controller's are the only ones."""
    drop = ("PET_", "MASTER_", "KUBERNETES_", "JOB_", "JOBSET_", "VC_", "PROBE_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for name in ("WORLD_SIZE", "RANK", "HOSTNAME"):
        env.pop(name, None)
    env.update(extra)
    return env
