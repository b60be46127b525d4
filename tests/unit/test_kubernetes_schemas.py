"""Every document under examples/kubernetes/ is valid against its kind's schema,
offline: the core kinds (Service, StatefulSet, Secret) against Kubernetes' own, which
kubernetes-validate ships; the custom resources (JobSet, TrainJob and its runtime,
PyTorchJob, PodMonitor) against the JSON Schemas made from their CRDs, kept in
examples/kubernetes/schemas/ (crd_schemas.py; README.md there says from which
release). Strict both ways: a misspelt or misplaced field fails, as `kubectl apply`
refuses it."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
SCHEMAS = EXAMPLES / "schemas"
# The oldest Kubernetes the manifests are for (podFailurePolicy's onPodConditions and
# onExitCodes are GA from 1.31) and a recent one.
KUBERNETES = ("1.31.0", "1.35.0")
CORE_GROUPS = {"v1", "apps/v1", "batch/v1"}


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        with open(path) as handle:
            for doc in yaml.safe_load_all(handle):
                if doc is not None:
                    yield f"{path.name}: {doc['kind']} {doc['metadata']['name']}", doc


DOCUMENTS = dict(documents())


def crd_schema(doc: dict[str, Any]) -> dict[str, Any]:
    group, version = doc["apiVersion"].split("/")
    path = SCHEMAS / group / f"{doc['kind'].lower()}_{version}.json"
    assert path.exists(), f"no schema for {doc['apiVersion']} {doc['kind']}: {path}"
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def crd_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(crd_schema(doc))
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(doc)
    ]


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_each_manifest_is_valid_against_its_kinds_schema(name: str) -> None:
    doc = DOCUMENTS[name]
    if doc["apiVersion"] in CORE_GROUPS:
        for version in KUBERNETES:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except (ValidationError, SchemaNotFoundError) as exc:
                pytest.fail(f"{name} against Kubernetes {version}: {exc}")
    else:
        errors = crd_errors(doc)
        assert not errors, f"{name}:\n" + "\n".join(errors[:10])


def _first_container(node: Any) -> dict[str, Any] | None:
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            return node["containers"][0]  # type: ignore[no-any-return]
        for value in node.values():
            found = _first_container(value)
            if found is not None:
                return found
    elif isinstance(node, list):
        for value in node:
            found = _first_container(value)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize(
    "name", [n for n, d in DOCUMENTS.items() if d["apiVersion"] not in CORE_GROUPS]
)
def test_the_schemas_refuse_a_misplaced_field(name: str) -> None:
    """The check can fail: a field put where the kind has none, at the top of the spec
    and inside a pod's container, is an error."""
    doc = copy.deepcopy(DOCUMENTS[name])
    doc["spec"]["replicas_typo"] = 1
    assert any("replicas_typo" in error for error in crd_errors(doc)), name
    container = _first_container(doc)
    if container is not None:
        del doc["spec"]["replicas_typo"]
        container["imagePullPolicyy"] = "Always"
        assert any("imagePullPolicyy" in error for error in crd_errors(doc)), name
