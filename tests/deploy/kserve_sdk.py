"""Check KServe manifests against the KServe Python SDK's models; run by the interpreter of
the separate ``.venv-kserve`` (``.ci/run`` builds it from setup.cfg's ``kserve-schema``
extra), never imported by the tests themselves.

The SDK's ``kserve.models`` (and the ``kubernetes.client.models`` they build on) are
generated from KServe's OpenAPI definitions, the Go types its CRDs' ``openAPIV3Schema``
is generated from: each model's ``attribute_map`` lists the fields of one object and
``openapi_types`` their types (``list[V1Container]`` in KServe's models, ``List[...]`` in
the pydantic-based Kubernetes client models). Every field of every object is checked recursively
(unknown field, wrong JSON type), and each object is built with the model's own
constructor, which refuses a missing required field.

Reads a JSON list of documents on stdin; prints a JSON list with a list of problems
(``"spec.predictor.model.storageURI: unknown field of V1beta1ModelSpec"``) per document.
"""

from __future__ import annotations

import json
import re
import sys
from importlib.metadata import version
from typing import Any

import kserve.models as kserve_models
import kubernetes.client.models as k8s_models

KINDS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
}
PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}
#: Types the SDK names but does not define as models: Kubernetes quantities ("2", 768Mi)
#: and int-or-string values.
SCALARS = {"ResourceQuantity", "V1beta1MetricQuantity", "object"}


def check(value: Any, type_name: str, path: str, problems: list[str]) -> None:
    """Append to ``problems`` what is wrong with ``value`` as an SDK ``type_name``."""
    if match := re.fullmatch(r"[Ll]ist\[(.+)\]", type_name):
        check_list(value, match[1], path, problems)
    elif match := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        check_map(value, match[1] or match[2], path, problems)
    elif type_name in PRIMITIVES:
        wanted = PRIMITIVES[type_name]
        if not isinstance(value, wanted) or (bool not in wanted and isinstance(value, bool)):
            problems.append(f"{path}: expected {type_name}, got {value!r}")
    elif type_name in SCALARS:
        if not isinstance(value, str | int | float):
            problems.append(f"{path}: expected a quantity or int-or-string, got {value!r}")
    else:
        check_object(value, type_name, path, problems)


def check_list(value: Any, item_type: str, path: str, problems: list[str]) -> None:
    if not isinstance(value, list):
        problems.append(f"{path}: expected a list, got {type(value).__name__}")
        return
    for index, item in enumerate(value):
        check(item, item_type, f"{path}[{index}]", problems)


def check_map(value: Any, item_type: str, path: str, problems: list[str]) -> None:
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a map, got {type(value).__name__}")
        return
    for key, item in value.items():
        check(item, item_type, f"{path}.{key}", problems)


def check_object(value: Any, type_name: str, path: str, problems: list[str]) -> None:
    """Check an object against the SDK model ``type_name``: its fields, then its constructor."""
    model = getattr(kserve_models, type_name, None) or getattr(k8s_models, type_name, None)
    if model is None:
        problems.append(f"{path}: the SDK has no model {type_name} (cannot check)")
        return
    if not isinstance(value, dict):
        problems.append(f"{path}: expected an object ({type_name}), got {value!r}")
        return
    attributes = {field: name for name, field in model.attribute_map.items()}
    for key, item in value.items():
        if key not in attributes:
            problems.append(f"{path}.{key}: unknown field of {type_name}")
        else:
            check(item, model.openapi_types[attributes[key]], f"{path}.{key}", problems)
    try:  # the models refuse a missing required field (None) in their constructors
        model(**{attributes[key]: item for key, item in value.items() if key in attributes})
    except (ValueError, TypeError) as exc:
        problems.append(f"{path or '.'}: {type_name}: {exc}")


def problems_of(document: dict[str, Any]) -> list[str]:
    """Every problem of one manifest, or a single one when its kind is not KServe's."""
    kind = KINDS.get((str(document.get("apiVersion")), str(document.get("kind"))))
    if kind is None:
        return [f"not a KServe kind: {document.get('apiVersion')} {document.get('kind')}"]
    problems: list[str] = []
    check(document, kind, "", problems)
    return [problem.lstrip(".") for problem in problems]


def main() -> None:
    if sys.argv[1:] == ["--version"]:  # the SDK version the checks ran against
        print(json.dumps(version("kserve")))
        return
    print(json.dumps([problems_of(document) for document in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
