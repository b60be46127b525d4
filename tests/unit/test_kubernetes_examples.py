"""examples/kubernetes/: each manifest's `rtrain launch` command, in the environment its
controller gives the pod, is one rtrain accepts and means what the manifest says.

The controllers' environments are tests/integration/pods.py's (`Controller.env`: what
the emulated-pod tests run), so the manifests and the emulation cannot drift apart:
the command's flags go through rtrain's own parser (cli/launch_args.py) and
build_launch_spec with exactly those variables, every $(VAR) the command uses must be
one the pod has, and the manifest must not set a variable its controller sets. The exit
code policies are checked against core/errors.ExitCode, the metrics port and the
liveness path against the PodMonitor and the metrics server. Every rtrain pod runs the
snapshotting script the image has, with the job secret from a Kubernetes Secret, in
the image the Dockerfile's documented build makes, and asks for a GPU a worker where
its script trains over NCCL (none over gloo). The schemas: test_kubernetes_schemas.py;
the CPU variant run on emulated pods, a pod lost: test_kubernetes_example_job.py."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

import rtrain
from rtrain.agent.observe.metrics_http import HEALTH_PATH
from rtrain.cli.launch_args import parse_launch_args
from rtrain.core.config.launch_spec import LaunchSpec, build_launch_spec
from rtrain.core.errors import ExitCode
from tests.integration.pods import Controller

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
MANIFESTS = (
    "trainjob.yaml",
    "pytorchjob-elastic.yaml",
    "jobset.yaml",
    "jobset-cpu.yaml",
    "etcd.yaml",
)
POD_ADDRESS = "10.244.0.7"
SECRET = ("rtrain-job-secret", "secret")  # the Secret every job's pods read RTRAIN_SECRET from
SCRIPT = "/workspace/train_resilient.py"
GPU = "nvidia.com/gpu"
# Kubeflow's ExitCode restart policy recreates a pod on these; 1-127 fail the job.
KUBEFLOW_RETRYABLE = {130, 137, 138, 143}


def documents(name: str) -> dict[str, dict[str, Any]]:
    with open(EXAMPLES / name) as handle:
        return {doc["kind"]: doc for doc in yaml.safe_load_all(handle)}


def pod_templates(node: Any) -> Iterator[dict[str, Any]]:
    """Every pod template under a manifest (a dict whose spec has containers)."""
    if isinstance(node, dict):
        if isinstance(node.get("spec"), dict) and "containers" in node["spec"]:
            yield node
        for value in node.values():
            yield from pod_templates(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_templates(value)


def runs_rtrain(container: Mapping[str, Any]) -> bool:
    words = container.get("command", [])
    return words[:1] == ["rtrain"] or any("rtrain launch" in str(w) for w in words)


def rtrain_container(template: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in template["spec"]["containers"] if runs_rtrain(c)]
    return container


def launch_argv(container: Mapping[str, Any]) -> list[str]:
    """The `rtrain launch ...` words: the command itself, or its line in a shell script."""
    words = [*container["command"], *container.get("args", [])]
    if words[0] == "rtrain":
        return words
    assert words[:2] == ["/bin/sh", "-c"], words
    (line,) = [ln for ln in words[2].splitlines() if ln.strip().startswith("rtrain ")]
    argv = shlex.split(line)
    return argv[:-1] if argv[-1] == "&" else argv


def container_env(container: Mapping[str, Any], pod: str) -> dict[str, str]:
    """The manifest's own variables, downward API fields as the pod `pod` would see them."""
    fields = {"metadata.name": pod, "status.podIP": POD_ADDRESS}
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item["valueFrom"]:
            env[item["name"]] = "the Secret's value"
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def expand(words: list[str], env: Mapping[str, str]) -> list[str]:
    """Kubernetes' $(VAR) in a command, every VAR one the pod has."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in env, f"the command uses $({name}), which the pod does not have"
        return env[name]

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, word) for word in words]


def launched(
    container: Mapping[str, Any], controller: Controller, index: int, nproc: str
) -> tuple[LaunchSpec, list[str]]:
    """The spec rtrain builds in pod `index`, and the script's words after it."""
    given = controller.env(index, nproc)  # type: ignore[arg-type]
    own = container_env(container, controller.pod_name(index)[0])
    clash = sorted(set(own) & set(given))
    assert not clash, f"the manifest sets {clash}, which {controller.kind} sets itself"
    env = {**given, **own}
    argv = expand(launch_argv(container), env)
    assert argv[:2] == ["rtrain", "launch"], argv
    raw = parse_launch_args(argv[2:], env)
    return build_launch_spec(raw), [raw["training_script"], *raw["training_script_args"]]


def ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def check_pod(template: Mapping[str, Any], container: Mapping[str, Any], spec: LaunchSpec) -> None:
    """What every rtrain pod here has: metrics on the `metrics` port the PodMonitor
    scrapes, a liveness probe on /healthz, /dev/shm in memory, the snapshotting script
    the image has, the job secret from the Secret, the image the Dockerfile builds."""
    assert spec.observe.metrics_port == ports(container)["metrics"]
    assert spec.entrypoint.target == SCRIPT
    (secret,) = [e for e in container.get("env", []) if e["name"] == "RTRAIN_SECRET"]
    reference = secret["valueFrom"]["secretKeyRef"]
    assert (reference["name"], reference["key"]) == SECRET and "value" not in secret
    assert (container["image"], container["imagePullPolicy"]) == (built_image(), "IfNotPresent")
    probe = container["livenessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == (HEALTH_PATH, "metrics")
    (shm,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == shm["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "rtrain"
    assert f"/workspace/{Path(SCRIPT).name}" in (EXAMPLES / "Dockerfile").read_text()


def built_image() -> str:
    """The tag of the Dockerfile's documented build, rtrain's version."""
    (build,) = re.findall(
        r"docker build -f examples/kubernetes/Dockerfile -t (\S+) \.",
        (EXAMPLES / "Dockerfile").read_text(),
    )
    assert build.rsplit(":", 1)[1] == rtrain.__version__, build
    return str(build)


def backend(script_args: list[str]) -> str:
    (chosen,) = [a.split("=", 1)[1] for a in script_args if a.startswith("--backend=")]
    return chosen


def check_devices(script_args: list[str], spec: LaunchSpec, gpus: int, nproc: str) -> None:
    """NCCL: GPUs asked for and a worker each (nproc `gpu`, `auto` or their count);
    gloo: none asked for, the workers named."""
    if backend(script_args) == "nccl":
        assert gpus > 0 and nproc in ("gpu", "auto", str(gpus)), (gpus, nproc)
    else:
        assert backend(script_args) == "gloo" and gpus == 0
        assert nproc.isdigit() and str(spec.nproc_per_node) == nproc


def gpus_of(container: Mapping[str, Any]) -> int:
    return int(container.get("resources", {}).get("limits", {}).get(GPU, 0))


def check_pod_failure_policy(job: Mapping[str, Any], container: str) -> None:
    """64 fails the Job at once, 75 is retried, an eviction is not counted."""
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    actions: dict[int | str, str] = {}
    for rule in job["podFailurePolicy"]["rules"]:
        codes = rule.get("onExitCodes")
        if codes is not None:
            assert (codes["containerName"], codes["operator"]) == (container, "In")
            actions.update(dict.fromkeys(codes["values"], rule["action"]))
        for condition in rule.get("onPodConditions", []):
            actions[condition["type"]] = rule["action"]
    assert actions[ExitCode.USAGE] == "FailJob"
    assert actions[ExitCode.TEMPFAIL] in ("Count", "Ignore")
    assert actions["DisruptionTarget"] == "Ignore"
    assert job["backoffLimit"] > 0


def check_jobset_failure_policy(spec: Mapping[str, Any]) -> None:
    first = spec["failurePolicy"]["rules"][0]
    assert (first["action"], first["onJobFailureReasons"]) == ("FailJobSet", ["PodFailurePolicy"])
    assert spec["failurePolicy"]["maxRestarts"] > 0


def test_trainer_v2_runtime_runs_rtrain_on_the_pet_variables_alone() -> None:
    docs = documents("trainjob.yaml")
    runtime, job = docs["ClusterTrainingRuntime"], docs["TrainJob"]
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"  # the plugin's names: <job>-node-0-<i>, container node
    assert node["template"]["metadata"]["labels"][
        "trainer.kubeflow.org/trainjob-ancestor-step"
    ] == ("trainer")
    (template,) = pod_templates(node)
    container = rtrain_container(template)
    assert container["name"] == "node"
    nodes = job["spec"]["trainer"]["numNodes"]
    assert "numProcPerNode" not in runtime["spec"]["mlPolicy"]["torch"]  # gone in Trainer 2.2
    gpus = int(job["spec"]["trainer"]["resourcesPerNode"]["limits"].get(GPU, 0))
    # Trainer's "auto": the GPUs asked for a node, when any
    nproc = str(job["spec"]["trainer"].get("numProcPerNode") or gpus or "auto")
    controller = Controller("trainer-v2", job["metadata"]["name"], nodes, 29400)
    reserved = {k for k in controller.env(0, nproc) if k.startswith("PET_")}  # type: ignore[arg-type]
    assert not reserved & {e["name"] for e in job["spec"]["trainer"].get("env", [])}
    for index in range(nodes):
        spec, script_args = launched(container, controller, index, nproc)
        check_devices(script_args, spec, gpus, nproc)
        assert spec.rdzv.backend == "static" and spec.node_rank == index
        assert (spec.nodes.min_nodes, spec.nodes.max_nodes) == (nodes, nodes)
        pod, subdomain = controller.pod_name(0)
        assert (spec.rdzv.host, spec.rdzv.port) == (f"{pod}.{subdomain}", 29400)
        check_pod(template, container, spec)
    check_pod_failure_policy(node["template"]["spec"], "node")
    check_jobset_failure_policy(runtime["spec"]["template"]["spec"])


def test_elastic_pytorchjob_runs_rtrain_on_the_operators_rendezvous() -> None:
    job = documents("pytorchjob-elastic.yaml")["PyTorchJob"]
    policy, worker = job["spec"]["elasticPolicy"], job["spec"]["pytorchReplicaSpecs"]["Worker"]
    low, high = policy["minReplicas"], policy["maxReplicas"]
    assert low < high and worker["replicas"] <= high
    (template,) = pod_templates(worker)
    container = rtrain_container(template)
    assert container["name"] == "pytorch"  # the operator's container
    controller = Controller(
        "pytorchjob-elastic", job["metadata"]["name"], worker["replicas"], policy["rdzvPort"],
        elastic=(low, high),
    )  # fmt: skip
    for index in range(worker["replicas"]):
        spec, script_args = launched(container, controller, index, job["spec"]["nprocPerNode"])
        check_devices(script_args, spec, gpus_of(container), job["spec"]["nprocPerNode"])
        assert spec.rdzv.backend == "c10d" and spec.rdzv.run_id == job["metadata"]["name"]
        assert (spec.nodes.min_nodes, spec.nodes.max_nodes) == (low, high)
        assert (spec.rdzv.host, spec.rdzv.port) == (controller.pod_name(0)[0], policy["rdzvPort"])
        check_pod(template, container, spec)
    # ExitCode: 75 goes back as a code the operator retries, 64 stays one it does not
    assert worker["restartPolicy"] == "ExitCode"
    script = container["command"][2]
    mapped = re.search(r'"\$code" -eq (\d+) \]; then exit (\d+)', script)
    assert mapped is not None
    assert int(mapped.group(1)) == ExitCode.TEMPFAIL and int(mapped.group(2)) in KUBEFLOW_RETRYABLE
    assert ExitCode.USAGE not in KUBEFLOW_RETRYABLE
    assert "trap 'kill -TERM" in script  # the eviction's SIGTERM reaches rtrain


@pytest.mark.parametrize("name", ["jobset.yaml", "jobset-cpu.yaml", "etcd.yaml"])
def test_jobset_pods_map_their_index_and_share_the_rendezvous(name: str) -> None:
    docs = documents(name)
    jobset = docs["JobSet"]
    (node,) = jobset["spec"]["replicatedJobs"]
    job = node["template"]["spec"]
    assert node["name"] == "node" and node["replicas"] == 1 and job["completionMode"] == "Indexed"
    (template,) = pod_templates(node)
    container = rtrain_container(template)
    controller = Controller("jobset", jobset["metadata"]["name"], job["parallelism"], 29500)
    subdomain = jobset["spec"].get("network", {}).get("subdomain", jobset["metadata"]["name"])
    raw = next(a for a in launch_argv(container) if a.startswith("--nproc-per-node="))
    for index in range(job["parallelism"]):
        spec, script_args = launched(container, controller, index, "gpu")
        check_devices(script_args, spec, gpus_of(container), raw.split("=", 1)[1])
        check_pod(template, container, spec)
        if spec.rdzv.backend == "static":
            assert spec.node_rank == index
            pod, default_subdomain = controller.pod_name(0)
            assert subdomain == default_subdomain  # the emulation's names are the manifest's
            assert spec.rdzv.host == f"{pod}.{subdomain}"
            assert spec.rdzv.port == ports(container)["rendezvous"]
        else:
            check_etcd_endpoints(docs, spec)
    check_pod_failure_policy(job, container["name"])
    check_jobset_failure_policy(jobset["spec"])
    service = docs.get("Service")
    if name != "etcd.yaml":
        assert service is not None and service["metadata"]["name"] == subdomain
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"] == {
            "jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"]
        }


def check_etcd_endpoints(docs: Mapping[str, Any], spec: LaunchSpec) -> None:
    """--rdzv-endpoint names every member of the etcd StatefulSet, at its client port."""
    members = docs["StatefulSet"]
    name, service = members["metadata"]["name"], members["spec"]["serviceName"]
    assert docs["Service"]["metadata"]["name"] == service
    (etcd,) = members["spec"]["template"]["spec"]["containers"]
    client = ports(etcd)["client"]
    expected = [(f"{name}-{i}.{service}", client) for i in range(members["spec"]["replicas"])]
    assert spec.rdzv.backend == "etcd" and list(spec.rdzv.endpoints) == expected
    assert spec.nodes.is_elastic
    cluster = next(a for a in etcd["command"] if a.startswith("--initial-cluster="))
    assert [p.split("=", 1)[0] for p in cluster.split("=", 1)[1].split(",")] == [
        host.split(".")[0] for host, _ in expected
    ]


def test_the_podmonitor_scrapes_every_rtrain_pod_on_its_metrics_port() -> None:
    monitor = documents("podmonitor.yaml")["PodMonitor"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    seen = 0
    for name in MANIFESTS:
        for doc in documents(name).values():
            for template in pod_templates(doc):
                if not any(runs_rtrain(c) for c in template["spec"]["containers"]):
                    continue
                seen += 1
                labels = template["metadata"]["labels"]
                assert selector.items() <= labels.items(), name
                assert endpoint["port"] in ports(rtrain_container(template)), name
    assert seen == len(MANIFESTS)


def test_the_dockerfile_installs_rtrain_on_a_pytorch_base() -> None:
    lines = (EXAMPLES / "Dockerfile").read_text().splitlines()
    (base,) = [ln for ln in lines if ln.startswith("FROM ")]
    assert base.split()[1].startswith("pytorch/pytorch:")
    assert any(ln.startswith("RUN pip install") and "/opt/rtrain-src" in ln for ln in lines)
    root = EXAMPLES.parents[1]
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (root / source).exists(), f"the Dockerfile copies {source}, not in the tree"
