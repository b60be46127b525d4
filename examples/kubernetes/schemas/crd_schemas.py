"""The JSON Schemas of the custom resources the manifests here use, made from their
CustomResourceDefinitions, so the manifests are checked offline
(tests/unit/test_kubernetes_schemas.py; the core kinds are kubernetes-validate's).

    python3 examples/kubernetes/schemas/crd_schemas.py CRD.yaml... --source "REPO TAG PATH"

writes <group>/<kind>_<version>.json beside this file for each version a CRD serves
(datree's CRDs-catalog layout), from its openAPIV3Schema, as kubeconform's
openapi2jsonschema does: `x-kubernetes-int-or-string` becomes an integer or a string,
`nullable` allows null, and an object with properties and no
`x-kubernetes-preserve-unknown-fields` takes no other key (the API server refuses an
unknown field, as `kubectl apply` asks it to by default). README.md here says where
each CRD came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


# The keywords whose values are schemas (one, a list, or a map of names to schemas).
ONE, LIST, MAP = (
    ("items", "additionalProperties", "not"),
    ("allOf", "anyOf", "oneOf"),
    (
        "properties",
        "patternProperties",
    ),
)


def strict(node: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI v3 schema `node` as JSON Schema (draft 4), objects closed, without
    its descriptions (what a field means, not what it accepts: four fifths of the text)."""
    schema: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description":
            continue
        if key in ONE and isinstance(value, dict):
            value = strict(value)
        elif key in LIST:
            value = [strict(item) for item in value]
        elif key in MAP:
            value = {name: strict(item) for name, item in value.items()}
        schema[key] = value
    if schema.pop("x-kubernetes-int-or-string", False):
        schema.pop("type", None)
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.pop("nullable", False) and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    open_ended = schema.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in schema and "additionalProperties" not in schema and not open_ended:
        schema["additionalProperties"] = False
    return schema


def convert(crd: dict[str, Any], source: str) -> dict[Path, dict[str, Any]]:
    """One schema a served version: its path under HERE, and the schema."""
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    made = {}
    for version in crd["spec"]["versions"]:
        if not version.get("served", True):
            continue
        schema = strict(version["schema"]["openAPIV3Schema"])
        schema["$comment"] = f"{kind} {group}/{version['name']}, from {source}"
        made[Path(group) / f"{kind.lower()}_{version['name']}.json"] = schema
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crds", nargs="+", type=Path, help="CustomResourceDefinition YAML files")
    parser.add_argument("--source", required=True, help="where they came from: REPO TAG PATH")
    args = parser.parse_args(argv)
    for path in args.crds:
        try:
            crd = yaml.safe_load(path.read_text())
            schemas = convert(crd, args.source)
        except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
            print(f"crd_schemas: {path}: not a CustomResourceDefinition ({exc})", file=sys.stderr)
            return 64
        for name, schema in schemas.items():
            (HERE / name).parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(schema, sort_keys=True, separators=(",", ":"))  # a third of indented
            (HERE / name).write_text(text + "\n")
            print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
