"""deploy/kubernetes, offline: every manifest against the Kubernetes 1.30 schemas, and each overlay
as `kubectl kustomize` renders it (where kubectl is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from frontend.routing.router import parse_urls

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES = "1.30.0"
OVERLAYS = ("cpu", "gpu")
# Custom resources have no schema in kubernetes-validate; their operator's group is checked by hand.
CUSTOM = {"monitoring.coreos.com/v1": {"ServiceMonitor"}}


def _documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _validate(doc: dict) -> None:
    if doc["apiVersion"] in CUSTOM:
        assert doc["kind"] in CUSTOM[doc["apiVersion"]]
        assert doc["metadata"]["name"] and doc["spec"]["selector"]["matchLabels"]
        assert all(e["port"] and e["path"] for e in doc["spec"]["endpoints"])
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
