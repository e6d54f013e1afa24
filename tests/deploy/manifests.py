"""The Kubernetes manifests under deploy/kubernetes/ as the deploy tests read them: the kustomization's
resources, every object by kind and name, and the scheduler's config as its ConfigMap carries it."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import REPO_ROOT

KUBERNETES = REPO_ROOT / "deploy" / "kubernetes"
EXAMPLES = KUBERNETES / "examples"
CONFIG_MAP = "llm-scheduler-config"
CONFIG_KEY = "config.toml"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization() -> dict[str, Any]:
    (doc,) = documents(KUBERNETES / "kustomization.yaml")
    return doc


@cache
def base() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, for every resource the kustomization lists."""
    return _index(KUBERNETES / name for name in kustomization()["resources"])


@cache
def examples() -> dict[tuple[str, str], dict[str, Any]]:
    return _index(sorted(EXAMPLES.glob("*.yaml")))


def _index(paths: Any) -> dict[tuple[str, str], dict[str, Any]]:
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        for doc in documents(path):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objects, f"{key} defined twice"
            objects[key] = doc
    return objects


def scheduler() -> dict[str, Any]:
    return base()[("Deployment", "llm-scheduler")]


def scheduler_container() -> dict[str, Any]:
    (container,) = scheduler()["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def config_text() -> str:
    text = base()[("ConfigMap", CONFIG_MAP)]["data"][CONFIG_KEY]
    assert isinstance(text, str)
    return text


def config_raw() -> dict[str, Any]:
    return tomllib.loads(config_text())


def secret_data(name: str) -> dict[str, str]:
    secret = base()[("Secret", name)]
    assert "data" not in secret, "the example Secret keeps its values readable (stringData)"
    data = secret["stringData"]
    assert isinstance(data, dict)
    return data


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def mounted_files(root: Path) -> None:
    """Lay out the scheduler container's config and secret mounts under `root` as the kubelet would:
    `root` + mountPath, with the ConfigMap's and Secret's items at their paths."""
    pod = scheduler()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in scheduler_container()["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        if "configMap" in volume:
            data = base()[("ConfigMap", volume["configMap"]["name"])]["data"]
            items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in data]
        elif "secret" in volume:
            data = secret_data(volume["secret"]["secretName"])
            items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
        else:
            continue
        if "subPath" in mount:
            (item,) = [i for i in items if i["path"] == mount["subPath"]]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
            continue
        for item in items:
            (target / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (target / item["path"]).write_text(data[item["key"]])
