"""deploy/k8s/ describes overspill on Kubernetes (no cluster here: checked against schemas).

- every manifest validates against the Kubernetes schemas (kubernetes-validate, offline);
- the KEDA ScaledObjects against KEDA's own CRD schema, kept in deploy/k8s/schemas/;
- every OVERSPILL_* name in the manifests and compose.yaml is a field of a settings class;
- every probe path is a route the process serves;
- compose.yaml and the manifests agree on the settings they share.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings

from producer.api.app import create_app
from producer.api.settings import ApiSettings
from producer.batches.state import BatchSettings
from producer.contract import RedisConnectionSettings
from workers.accounting import BudgetConfig
from workers.backends.remote import ProvidersConfig, RemoteConfig
from workers.core import WorkerConfig
from workers.delivery import WebhookSettings
from workers.dispatch import CacheConfig
from workers.routing import RouterConfig

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
SETTINGS: list[type[BaseSettings]] = [
    WorkerConfig,
    RouterConfig,
    RemoteConfig,
    CacheConfig,
    BudgetConfig,
    ProvidersConfig,
    WebhookSettings,
    ApiSettings,
    BatchSettings,
    RedisConnectionSettings,
]
# The Python worker serves Prometheus on its metrics port (any path; /metrics is the real one).
WORKER_ROUTES = {"/metrics"}
# Triton's KServe v2 health routes.
TRITON_ROUTES = {"/v2/health/live", "/v2/health/ready"}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            docs.append((name, doc))
    return docs


DOCS = _documents()
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())


def _of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in DOCS if d["kind"] == kind]


def _setting_names() -> set[str]:
    names = set()
    for cls in SETTINGS:
        prefix = cls.model_config.get("env_prefix", "")
        for field, info in cls.model_fields.items():
            alias = info.validation_alias
            choices = getattr(alias, "choices", None)
            names.update(str(c) for c in choices) if choices else names.add((prefix + field).upper())
    return names


def _env_names(node: Any) -> set[str]:
    """Every OVERSPILL_* name anywhere in a manifest: ConfigMap keys, env entries, scripts."""
    return set(re.findall(r"\bOVERSPILL_[A-Z0-9_]+", yaml.safe_dump(node)))


def _config() -> dict[str, str]:
    (config,) = [d for d in _of_kind("ConfigMap") if d["metadata"]["name"] == "overspill-config"]
    return config["data"]


def _containers(name: str) -> list[dict[str, Any]]:
    (deploy,) = [d for d in _of_kind("Deployment") if d["metadata"]["name"] == name]
    return deploy["spec"]["template"]["spec"]["containers"]


# ---------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    "doc",
    [d for _, d in DOCS if not d["apiVersion"].startswith("keda.sh")],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_each_manifest_validates_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_scaled_objects_validate_against_kedas_crd() -> None:
    crd = yaml.safe_load((K8S / "schemas" / "keda.sh_scaledobjects.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    scaled = _of_kind("ScaledObject")
    assert {d["spec"]["scaleTargetRef"]["name"] for d in scaled} == {"worker", "triton"}
    for doc in scaled:
        jsonschema.validate(doc, schema)
    bad = {**scaled[0], "spec": {**scaled[0]["spec"], "minReplicaCount": "two"}}
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict enough to catch a typo
        jsonschema.validate(bad, schema)


def test_the_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_the_parts_the_issue_names_are_there() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in DOCS}
    for part in ("api", "worker", "triton"):
        assert ("Deployment", part) in kinds and ("PodDisruptionBudget", part) in kinds
    assert ("StatefulSet", "redis") in kinds and ("Namespace", "overspill") in kinds
    (headless,) = [d for d in _of_kind("Service") if d["metadata"]["name"] == "triton-headless"]
    assert headless["spec"]["clusterIP"] == "None"
    triton = _containers("triton")[0]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "1"


# ---------------------------------------------------------------------------- settings


def test_every_overspill_name_in_the_manifests_and_compose_is_a_real_setting() -> None:
    known = _setting_names()
    used = _env_names([d for _, d in DOCS]) | _env_names(COMPOSE["x-overspill-env"])
    for service in COMPOSE["services"].values():
        used |= {k for k in service.get("environment", {}) if k.startswith("OVERSPILL_")}
    assert used, "no settings found at all"
    assert used - known == set()
    assert "OVERSPILL_REDIS_SENTINELS" in used and "OVERSPILL_REDIS_WAIT_REPLICAS" in used


def test_every_setting_in_the_configmap_parses_in_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in _config().items():
        monkeypatch.setenv(name, value)
    for cls in (RouterConfig, RemoteConfig, ApiSettings, BatchSettings, RedisConnectionSettings):
        cls()  # a value of the wrong type would raise here
    assert RedisConnectionSettings().wait_replicas == 1
    assert RouterConfig().gateway_mode == "hybrid"


def test_secrets_are_files_at_the_paths_the_settings_name() -> None:
    config = _config()
    keys = {k for d in _of_kind("Secret") for k in d["stringData"]}
    for setting in (
        "OVERSPILL_TENANTS_FILE",
        "OVERSPILL_REDIS_PASSWORD_FILE",
        "OVERSPILL_REMOTE_API_KEY_FILE",
    ):
        path = Path(config[setting])
        assert path.parent == Path("/run/secrets") and path.name in keys
    for part in ("api", "worker"):
        (container,) = _containers(part)
        assert {"name": "secrets", "mountPath": "/run/secrets", "readOnly": True} in container["volumeMounts"]
        assert "env" not in container or all("secretKeyRef" not in str(e) for e in container["env"])


def test_compose_and_the_manifests_agree_on_shared_settings() -> None:
    """Same names, same values; Triton's host differs (a service name in each), not its port."""
    compose = COMPOSE["x-overspill-env"]
    config = _config()
    shared = set(compose) & set(config)
    assert shared >= {"OVERSPILL_REDIS_URL", "OVERSPILL_PREFIX", "OVERSPILL_TENANTS_FILE"}
    assert set(compose) <= set(config)  # Kubernetes knows every setting compose sets
    for name in shared:
        if name.startswith("OVERSPILL_TRITON_"):
            assert compose[name].rpartition(":")[2] == config[name].rpartition(":")[2], name
        else:
            assert compose[name] == config[name], name
    worker = COMPOSE["services"]["worker"]["environment"]
    assert worker["OVERSPILL_METRICS_PORT"] == config["OVERSPILL_METRICS_PORT"]


# ---------------------------------------------------------------------------- probes and drain


def _probes(container: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (c[kind]["httpGet"]["path"], c[kind]["httpGet"]["port"])
        for c in [container]
        for kind in ("readinessProbe", "livenessProbe", "startupProbe")
        if kind in c and "httpGet" in c[kind]
    ]


def test_every_probe_path_is_a_route_the_process_serves() -> None:
    api_routes = set(create_app(ApiSettings(auth="off")).openapi()["paths"])
    (api,) = _containers("api")
    (worker,) = _containers("worker")
    (triton,) = _containers("triton")
    assert {p for p, _ in _probes(api)} == {"/readyz", "/healthz"} <= api_routes
    assert {p for p, _ in _probes(worker)} <= WORKER_ROUTES
    assert {p for p, _ in _probes(triton)} <= TRITON_ROUTES
    for container in (api, worker, triton):
        ports = {p["name"] for p in container["ports"]}
        assert all(port in ports for _, port in _probes(container)), container["name"]


def test_worker_grace_outlasts_its_drain_and_pods_spread() -> None:
    drain = float(_config()["OVERSPILL_SHUTDOWN_GRACE_S"])
    for name in ("api", "worker", "triton"):
        (deploy,) = [d for d in _of_kind("Deployment") if d["metadata"]["name"] == name]
        spec = deploy["spec"]["template"]["spec"]
        assert spec["topologySpreadConstraints"], name
        assert all("requests" in c["resources"] for c in spec["containers"]), name
        if name == "worker":
            assert spec["terminationGracePeriodSeconds"] > drain + 5
