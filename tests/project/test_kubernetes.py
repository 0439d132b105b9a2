"""deploy/kubernetes, offline: every manifest against the Kubernetes 1.30 schemas, and each overlay
as `kubectl kustomize` renders it (where kubectl is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from frontend.config import FrontendConfig
from frontend.routing.router import parse_urls

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES = "1.30.0"
OVERLAYS = ("cpu", "gpu")


def _service_monitor(spec: dict) -> None:
    assert spec["selector"]["matchLabels"] and all(e["port"] and e["path"] for e in spec["endpoints"])


def _inference_pool(spec: dict) -> None:
    """The v1 schema's required fields (inference.networking.k8s.io/v1, Gateway API Inference Extension)."""
    assert set(spec) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    assert set(spec["selector"]) == {"matchLabels"} and spec["selector"]["matchLabels"]
    assert 1 <= len(spec["targetPorts"]) <= 8 and all(0 < p["number"] < 65536 for p in spec["targetPorts"])
    picker = spec["endpointPickerRef"]
    assert set(picker) <= {"group", "kind", "name", "port", "failureMode"} and picker["name"]
    assert picker.get("kind", "Service") != "Service" or 0 < picker["port"]["number"] < 65536
    assert picker.get("failureMode", "FailClose") in ("FailOpen", "FailClose")


def _http_route(spec: dict) -> None:
    assert all(p["name"] for p in spec["parentRefs"])
    assert all(b["name"] and b["kind"] for rule in spec["rules"] for b in rule["backendRefs"])


# Custom resources have no schema in kubernetes-validate: each kind's fields are checked by hand.
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _service_monitor,
    ("inference.networking.k8s.io/v1", "InferencePool"): _inference_pool,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): _http_route,
}
CUSTOM_GROUPS = {api for api, _ in CUSTOM}


def _documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _validate(doc: dict) -> None:
    if doc["apiVersion"] in CUSTOM_GROUPS:
        assert doc["metadata"]["name"]
        CUSTOM[doc["apiVersion"], doc["kind"]](doc["spec"])
        return
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_is_valid_for_kubernetes_1_30(path: Path):
    for doc in _documents(path.read_text()):
        _validate(doc)


def _render(directory: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / directory)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    docs = _documents(out.stdout)
    for doc in docs:
        _validate(doc)
    return docs


def _by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_the_whole_deployment(overlay: str):
    docs = _by_kind(_render(f"overlays/{overlay}"))
    triton = docs["Deployment", "tritonlm-triton"]["spec"]["template"]["spec"]
    container = triton["containers"][0]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(container)
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 300
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    shm = next(v for v in triton["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert triton["securityContext"]["runAsNonRoot"]
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
    assert (gpus == 1) == (overlay == "gpu")

    headless = docs["Service", "tritonlm-triton"]
    assert headless["spec"]["clusterIP"] == "None"
    frontend = docs["Deployment", "tritonlm-frontend"]["spec"]["template"]["spec"]["containers"][0]
    urls = parse_urls(next(e["value"] for e in frontend["env"] if e["name"] == "TRITON_URLS"))
    grpc = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "grpc")
    assert (urls.dns_name, urls.port) == ("tritonlm-triton", grpc)  # discovery through the headless Service
    assert ("Service", "tritonlm-frontend") in docs

    hpa = docs["HorizontalPodAutoscaler", "tritonlm-triton"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "tritonlm_engine_waiting"
    assert (
        docs["HorizontalPodAutoscaler", "tritonlm-frontend"]["spec"]["metrics"][0]["resource"]["name"]
        == "cpu"
    )
    assert {("PodDisruptionBudget", "tritonlm-triton"), ("PodDisruptionBudget", "tritonlm-frontend")} <= set(
        docs
    )


def test_monitoring_scrapes_both_and_serves_the_hpa_metric():
    docs = _by_kind(_render("monitoring"))
    assert {("ServiceMonitor", "tritonlm-triton"), ("ServiceMonitor", "tritonlm-frontend")} <= set(docs)
    rules = yaml.safe_load(docs["ConfigMap", "tritonlm-prometheus-adapter-rules"]["data"]["config.yaml"])
    assert rules["rules"][0]["name"]["as"] == "tritonlm_engine_waiting"


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_the_inference_gateway_overlay_pools_model_server_pods_on_the_port_of_the_api_and_its_metrics():
    docs = _by_kind(_render("overlays/inference-gateway"))
    pool = docs["InferencePool", "tritonlm"]["spec"]
    pod = docs["Deployment", "tritonlm-triton"]["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()  # the pool selects these pods
    assert labels["llm-d.ai/engine-type"] == "vllm"  # the picker reads vLLM's metric names
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    frontend, triton = containers["frontend"], containers["tritonserver"]
    # The frontend's settings as it reads them: its command's flags, then its environment.
    config = FrontendConfig.load(frontend["command"][3:], _env(frontend))
    # Each pod is one model server: the frontend serves the API and /metrics on the pool's port...
    assert [p["number"] for p in pool["targetPorts"]] == [config.frontend_port] == [_ports(frontend)["api"]]
    # ...and reaches its own tritonserver, whose metrics port it reads the engines' state from.
    assert config.triton_url() == f"localhost:{_ports(triton)['grpc']}"
    assert (
        config.triton_metrics_url(config.triton_url())
        == f"http://localhost:{_ports(triton)['metrics']}/metrics"
    )
    for flag, port in (("--grpc-port", "grpc"), ("--metrics-port", "metrics")):
        assert f"{flag}={_ports(triton)[port]}" in triton["args"]
    assert _env(frontend)["MODEL_DIR"] == _env(triton)["MODEL_DIR"]  # one checkpoint, both sides
    assert frontend["image"] == triton["image"]
    assert pool["endpointPickerRef"]["name"] and pool["endpointPickerRef"]["port"]["number"]

    route = docs["HTTPRoute", "tritonlm"]["spec"]
    backends = [b for rule in route["rules"] for b in rule["backendRefs"]]
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "tritonlm"}]
    assert ("Deployment", "tritonlm-frontend") not in docs  # no separate frontend
    assert ("Service", "tritonlm-frontend") not in docs  # the gateway spreads the traffic
