"""deploy/kubernetes/ against Kubernetes' own schemas (kubernetes-validate ships them, offline), the CRD
examples against the fields of theirs that they use, and every manifest against the service: its config
loads with our loader from the files the pod mounts, ports, selectors, secrets and names line up, the
termination grace covers the drain, and the autoscaling queries name series the scheduler exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from scheduler_svc.app.settings import load_config
from scheduler_svc.core.keys import key_digest, load_key_digests
from scheduler_svc.dispatch.metrics import SchedulerMetrics
from scheduler_svc.dispatch.scheduler import CUT_REPORT_SECONDS
from tests.deploy.manifests import (
    CONFIG_MAP,
    KUBERNETES,
    base,
    config_raw,
    documents,
    examples,
    kustomization,
    matches,
    mounted_files,
    port_of,
    scheduler,
    scheduler_container,
    secret_data,
)

# The oldest release the manifests need (the preStop `sleep` action is on by default from 1.30) and the newest
# the validator ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
CLOSING_SECONDS = CUT_REPORT_SECONDS + 1.0 + 1.0  # after the grace: cut streams report, gRPC and HTTP stop (1 s each)

# Custom resources: no schema ships with the validator, so each is checked against the part of its CRD's
# schema the example uses (field names and types, required fields; unknown fields refused), and below against
# what the service exports.
_STRING = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": _STRING}
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": _STRING, "labels": _LABELS}}
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "PodMonitor"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": _STRING,
            "kind": _STRING,
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "podMetricsEndpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"matchLabels": _LABELS},
                    },
                    "podMetricsEndpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["port"],
                            "properties": {
                                "port": _STRING,
                                "path": _STRING,
                                "interval": {"type": "string", "pattern": r"^\d+[smh]$"},
                            },
                        },
                    },
                },
            },
        },
    },
    ("keda.sh/v1alpha1", "ScaledObject"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": _STRING,
            "kind": _STRING,
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["scaleTargetRef", "triggers"],
                "additionalProperties": False,
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {"apiVersion": _STRING, "kind": _STRING, "name": _STRING},
                    },
                    "minReplicaCount": {"type": "integer", "minimum": 0},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "pollingInterval": {"type": "integer", "minimum": 1},
                    "cooldownPeriod": {"type": "integer", "minimum": 0},
                    "advanced": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "horizontalPodAutoscalerConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {"behavior": {"type": "object"}},  # HPA's own, checked below
                            }
                        },
                    },
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["type", "metadata"],
                            "additionalProperties": False,
                            "properties": {
                                "type": {"const": "prometheus"},
                                "name": _STRING,
                                "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                "metadata": {
                                    "type": "object",
                                    "required": ["serverAddress", "query", "threshold"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "serverAddress": {"type": "string", "pattern": "^https?://"},
                                        "query": _STRING,
                                        "threshold": {"type": "string", "pattern": r"^\d+(\.\d+)?$"},
                                        "activationThreshold": {"type": "string", "pattern": r"^\d+(\.\d+)?$"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def all_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {**base(), **examples()}


def test_the_kustomization_lists_every_manifest_beside_it_once() -> None:
    listed = kustomization()["resources"]
    assert len(listed) == len(set(listed))
    beside = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == beside, "examples/ (custom resources, engines) stay out of the base"
    (image,) = kustomization()["images"]
    assert scheduler_container()["image"] == image["name"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_kubernetes_schemas(version: str) -> None:
    custom, problems = [], []
    for (kind, name), obj in all_objects().items():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except SchemaNotFoundError:
            custom.append((obj["apiVersion"], kind))
            schema = CRD_SCHEMAS.get((obj["apiVersion"], kind))
            assert schema is not None, f"{kind}/{name}: no schema for {obj['apiVersion']}"
            problem = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(obj))
            if problem is not None:
                problems.append(f"{kind}/{name}: {'.'.join(map(str, problem.path))}: {problem.message}")
        except jsonschema.ValidationError as exc:
            problems.append(f"{kind}/{name} against {version}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert not problems, "\n".join(problems)
    assert sorted(custom) == sorted(CRD_SCHEMAS), "exactly the custom resources go by their own schemas"


def test_the_scaled_objects_hpa_behavior_is_kubernetes_own() -> None:
    scaled = examples()[("ScaledObject", "vllm")]
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "vllm"},
        "spec": {"scaleTargetRef": scaled["spec"]["scaleTargetRef"], "maxReplicas": 4, "behavior": behavior},
    }
    kubernetes_validate.validate(hpa, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_configmap_config_loads_from_the_files_the_pod_mounts(tmp_path: Path) -> None:
    """Our loader on the config exactly as the pod reads it: the file at the CMD's path and the key file at
    auth.api_keys_file, both where the Deployment mounts them (paths moved under tmp_path)."""
    mounted_files(tmp_path)
    container = scheduler_container()
    path = tmp_path / container["args"][container["args"].index("--config") + 1].lstrip("/")
    text = path.read_text().replace('"/etc/llmsched/', f'"{tmp_path}/etc/llmsched/')
    path.write_text(text)
    config = load_config(path)
    assert config.cluster.store == "redis" and config.cluster.replica_name == "", "pods name themselves"
    digests = load_key_digests(config.auth)
    assert digests[key_digest("ops-example-key")] == "ops" and "ops" in config.auth.admin_users
    assert digests[key_digest("team-a-example-key")] == "team-a"  # as the Secret's comment says
    env = {e["name"]: e for e in container["env"]}
    password = env[config.cluster.redis_password_env]["valueFrom"]["secretKeyRef"]
    assert password["key"] in secret_data(password["name"])


def test_ports_line_up_from_the_config_to_the_probes_the_services_and_the_monitor() -> None:
    server = config_raw()["server"]
    container = scheduler_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "grpc": port_of(server["listen"]),
        "http": port_of(server["http_listen"]),
        "metrics": port_of(server["metrics_listen"]),
    }
    assert all(server[k].startswith("0.0.0.0:") for k in ("listen", "http_listen", "metrics_listen"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["grpc"], f"{probe}: native gRPC on grpc.health.v1"
    pod_labels = scheduler()["spec"]["template"]["metadata"]["labels"]
    services = [o for (k, _), o in base().items() if k == "Service" and matches(o["spec"]["selector"], pod_labels)]
    assert len(services) == 2
    for service in services:
        assert matches(service["spec"]["selector"], pod_labels)
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports and port["port"] == ports[port["targetPort"]]
    assert {p["targetPort"] for p in base()[("Service", "llm-scheduler")]["spec"]["ports"]} == set(ports)
    monitor = examples()[("PodMonitor", "llm-scheduler")]
    assert matches(monitor["spec"]["selector"]["matchLabels"], pod_labels)
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_selectors_pick_their_pods() -> None:
    pod_labels = scheduler()["spec"]["template"]["metadata"]["labels"]
    assert matches(scheduler()["spec"]["selector"]["matchLabels"], pod_labels)
    assert matches(base()[("PodDisruptionBudget", "llm-scheduler")]["spec"]["selector"]["matchLabels"], pod_labels)
    redis = base()[("Deployment", "llm-scheduler-redis")]
    redis_labels = redis["spec"]["template"]["metadata"]["labels"]
    assert matches(base()[("Service", "llm-scheduler-redis")]["spec"]["selector"], redis_labels)
    policy = base()[("NetworkPolicy", "llm-scheduler-redis")]["spec"]
    assert matches(policy["podSelector"]["matchLabels"], redis_labels)
    (rule,) = policy["ingress"]
    assert matches(rule["from"][0]["podSelector"]["matchLabels"], pod_labels)
    assert not matches(rule["from"][0]["podSelector"]["matchLabels"], redis_labels)


def test_the_cluster_meets_on_the_redis_of_the_manifests() -> None:
    cluster = config_raw()["cluster"]
    host, port = re.fullmatch(r"redis://([^:/]+):(\d+)/\d+", cluster["redis_url"]).groups()  # type: ignore[union-attr]
    service = base()[("Service", host)]
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    redis = base()[("Deployment", "llm-scheduler-redis")]["spec"]["template"]["spec"]["containers"][0]
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    redis_secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}["REDIS_PASSWORD"]
    scheduler_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in scheduler_container()["env"]}
    assert scheduler_env[cluster["redis_password_env"]] == redis_secret, "both ends read the same password"


def test_the_termination_grace_covers_the_prestop_sleep_and_the_drain() -> None:
    pod = scheduler()["spec"]["template"]["spec"]
    sleep = scheduler_container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = config_raw()["server"]["shutdown_grace_seconds"]
    grace = pod["terminationGracePeriodSeconds"]
    needed = sleep + drain + CLOSING_SECONDS
    assert needed <= grace <= needed + 10, f"grace {grace}s for {sleep}s preStop + {drain}s drain + closing"
    liveness = scheduler_container()["livenessProbe"]
    stall = config_raw()["server"].get("unhealthy_after_stalled_seconds", 30.0)
    assert liveness["periodSeconds"] * liveness["failureThreshold"] <= stall, "a wedged loop restarts soon"


def test_the_pods_run_as_the_images_user_with_a_read_only_root() -> None:
    from tests.deploy import dockerfile

    uid, _, gid = dockerfile.stages()[-1].one("USER").partition(":")
    security = scheduler()["spec"]["template"]["spec"]["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid)) and security["runAsNonRoot"]
    container = scheduler_container()["securityContext"]
    assert container["readOnlyRootFilesystem"] and not container["allowPrivilegeEscalation"]


def test_memory_covers_the_configured_queue_caps_at_the_measured_costs() -> None:
    """Each replica may hold every queued call (a ClusterIP Service keeps each client's channel on one
    replica, and the caps are the leader's, for the cluster): idle RSS (75 MiB in cluster mode, measured with
    this config) + 24 KB per queued call with its open stream + 3.4 bytes per queued prompt byte (both from
    bench.tools.stream_memory), with room to spare."""
    model = config_raw()["models"][0]
    resources = scheduler_container()["resources"]
    need = 75 * 2**20 + model["max_queued"] * 24 * 1024 + model["max_queued_bytes"] * 3.4
    request, limit = (_bytes(resources[k]["memory"]) for k in ("requests", "limits"))
    assert request == limit, "memory is guaranteed (an OOM kill drops every queued call of the replica)"
    assert 1.1 * need <= request <= 2 * need, f"{request / 2**20:.0f} MiB for {need / 2**20:.0f} MiB needed"
    assert "cpu" not in resources["limits"], "no CPU limit: a throttled event loop delays every stream"


def _bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMG]i)?", quantity).groups()  # type: ignore[union-attr]
    return int(number) * {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[unit]


def _exported() -> dict[str, set[str]]:
    """Gauge and counter sample names the scheduler exports (as PromQL sees them) -> their labels."""
    metrics = SchedulerMetrics()
    samples: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
        if family.type in ("gauge", "counter"):
            samples.setdefault(family.name + ("_total" if family.type == "counter" else ""), set())
    for metric in (metrics.queue_depth, metrics.in_flight):
        samples[metric._name] = set(metric._labelnames)
    for family in metrics.queued_demand.describe():
        samples[family.name] = {"model", "priority_class"}
    return samples


def test_the_autoscaler_scales_the_listed_engines_on_series_the_scheduler_exports() -> None:
    scaled = examples()[("ScaledObject", "vllm")]["spec"]
    target = scaled["scaleTargetRef"]
    engines = examples()[(target["kind"], target["name"])]
    service = engines["spec"]["serviceName"]
    (engine_port,) = engines["spec"]["template"]["spec"]["containers"][0]["ports"]
    raw = config_raw()
    (model,) = raw["models"]
    urls = [b["url"] for b in model["backends"]]
    assert urls == [f"http://{target['name']}-{i}.{service}:{engine_port['containerPort']}" for i in range(len(urls))]
    assert 1 <= scaled["minReplicaCount"] <= engines["spec"]["replicas"] <= scaled["maxReplicaCount"] <= len(urls)
    absent = scaled["maxReplicaCount"] - scaled["minReplicaCount"]
    assert model["failover_attempts"] >= absent, "a request may meet every absent engine once and still be served"
    args = engines["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {b["max_num_seqs"] for b in model["backends"]} == {int(args[args.index("--max-num-seqs") + 1])}
    assert all(b["engine_model"] == args[args.index("--model") + 1] for b in model["backends"])

    exported = _exported()
    classes = {c["name"] for c in raw["scheduling"]["classes"]}
    for trigger in scaled["triggers"]:
        query = trigger["metadata"]["query"]
        names = re.findall(r"\bllmsched_[a-z_]+\b", query)
        assert names, query
        for name in names:
            assert name in exported, f"{name} is not exported"
        for selector in re.findall(r"\{([^}]*)\}", query):
            for label, value in re.findall(r'(\w+)\s*=\s*"([^"]*)"', selector):
                assert label in {"model", "priority_class"}
                assert value in ({model["name"]} if label == "model" else classes), f"{label}={value}"
        for grouping in re.findall(r"\bby\s*\(([^)]*)\)", query):
            assert {g.strip() for g in grouping.split(",")} <= {"pod", "model", "priority_class"}


def test_the_configmap_is_what_the_deployment_mounts() -> None:
    volumes = {v["name"]: v for v in scheduler()["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == CONFIG_MAP
    for doc in documents(KUBERNETES / "scheduler-config.yaml"):
        assert set(doc["data"]) == {"config.toml"}
