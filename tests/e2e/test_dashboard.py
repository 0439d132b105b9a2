"""The Grafana dashboard (deploy/kubernetes/monitoring/grafana-dashboard.json) queries only metrics
that exist: every metric name in its PromQL, and every label it groups by, is found in a live
`/metrics` after a few requests -- the frontends' (a router's per-replica metrics too, with two
replicas, one of them down; refusals, from a frontend whose Triton is gone) and Triton's metrics
port (Nvidia's nv_* and the engine's tritonlm_*)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port

import launcher

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
# PromQL words that are neither metrics nor functions (those are followed by "(").
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
# Labels Prometheus adds when it scrapes (or a histogram's own), never in a /metrics page's samples.
_SCRAPE_LABELS = {"instance", "job", "namespace", "pod", "service", "le"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def expressions(dashboard: dict) -> list[str]:
    """Every panel target's PromQL (rows' panels included)."""
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: names not called as functions, with label
    values, matchers, ranges and grouping clauses taken out first."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = _GROUPING.sub(" ", expr)
    names = set()
    for match in _NAME.finditer(expr):
        if match.group() not in _KEYWORDS and not expr[match.end() :].lstrip().startswith("("):
            names.add(match.group())
    return names


def grouping_labels(expr: str) -> set[str]:
    return {label.strip() for _, labels in _GROUPING.findall(expr) for label in labels.split(",")} - {""}


def test_metric_names_are_read_from_promql():
    expr = (
        'histogram_quantile(0.9, sum by (le, route) (rate(a_bucket{x=~"[45]..", y="$v"}[$__rate_interval])))'
        ' / ignoring(stat) delta(b{stat="c"}[5m]) and on(d) e'
    )
    assert metric_names(expr) == {"a_bucket", "b", "e"}
    assert grouping_labels(expr) == {"le", "route", "stat", "d"}


def test_the_dashboard_is_valid_and_provisioned_by_the_monitoring_overlay():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and expressions(dashboard)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        ["kubectl", "kustomize", str(MONITORING)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    maps = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ConfigMap"]
    provisioned = next(m for m in maps if m["metadata"]["name"] == "tritonlm-grafana-dashboard")
    assert provisioned["metadata"]["labels"]["grafana_dashboard"] == "1"  # the Grafana sidecar's label
    assert [json.loads(v) for v in provisioned["data"].values()] == [dashboard]


@contextlib.contextmanager
def frontend(servers, triton_urls: str, log: Path) -> Iterator[str]:
    """Another frontend for the session's model, reaching `triton_urls`; its URL once it answers."""
    ports = launcher.Ports(frontend=free_port(), http=free_port(), grpc=free_port(), metrics=free_port())
    process = launcher.start_frontend(
        ports, servers.model_name, log, model_dir=servers.model_dir, triton_urls=triton_urls
    )
    url = f"http://127.0.0.1:{ports.frontend}"
    try:
        launcher.wait_ready(url + "/metrics", process, 60, "frontend")  # /health needs a ready Triton
        yield url
    finally:
        launcher.stop(process)


@pytest.fixture(scope="module")
def router_frontend(servers, tmp_path_factory) -> Iterator[str]:
    """Routing over two replicas: the session's Triton and a port nobody listens on (taken out: the
    health metric shows both values)."""
    urls = f"127.0.0.1:{servers.ports.grpc},127.0.0.1:{free_port()}"
    with frontend(servers, urls, tmp_path_factory.mktemp("router") / "frontend.log") as url:
        yield url


@pytest.fixture(scope="module")
def stranded_frontend(servers, tmp_path_factory) -> Iterator[str]:
    """A frontend whose Triton is gone: it refuses requests with 503 (the refusal metrics)."""
    with frontend(
        servers, f"127.0.0.1:{free_port()}", tmp_path_factory.mktemp("gone") / "frontend.log"
    ) as url:
        yield url


def samples(text: str) -> dict[str, set[str]]:
    """A /metrics page's sample names, each with the label names its samples carry."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s", line)
        if match:
            labels = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', match.group(2) or "")
            found.setdefault(match.group(1), set()).update(labels)
    return found


def exercise(url: str, model: str) -> None:
    """A few requests of each kind the panels show: streams (TTFT, token gaps), a plain one, a
    refusal (400), the same prompt twice (prefix cache, router affinity)."""
    chat = {"model": model, "messages": [{"role": "user", "content": "Hello there, how are you?"}]}
    for _ in range(3):
        with httpx.stream(
            "POST", url + "/v1/chat/completions", json={**chat, "stream": True, "max_tokens": 6}, timeout=120
        ) as response:
            assert response.status_code == 200
            response.read()
    assert httpx.post(
        url + "/", json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}}, timeout=120
    ).is_success
    assert (
        httpx.post(
            url + "/v1/completions", json={"model": model, "prompt": "x", "n": 0}, timeout=60
        ).status_code
        == 400
    )


def test_every_metric_the_dashboard_queries_is_served(servers, router_frontend, stranded_frontend):
    for url in (servers.frontend_url, router_frontend):
        exercise(url, servers.model_name)
    refused = httpx.post(stranded_frontend + "/", json={"inputs": "Hi"}, timeout=60)
    assert refused.status_code == 503, refused.text
    frontends = (servers.frontend_url, router_frontend, stranded_frontend)
    live: dict[str, set[str]] = {}
    for url in (*(f + "/metrics" for f in frontends), servers.metrics_url):
        for name, labels in samples(httpx.get(url, timeout=30).text).items():
            live.setdefault(name, set()).update(labels)
    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    queried = {m for v in variables for m in re.findall(r"label_values\((\w+)", v)}
    for expr in expressions(dashboard):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        missing = names - live.keys()
        assert not missing, f"{sorted(missing)} (in {expr!r}) not in any live /metrics"
        labels = grouping_labels(expr) - _SCRAPE_LABELS
        carried = set().union(*(live[n] for n in names))
        assert labels <= carried, f"{expr!r} groups by {sorted(labels - carried)}, which its metrics lack"
        queried |= names
    assert not queried - live.keys()
    # The panels the operations guide promises, each by its metric.
    for family in (
        "tritonlm_frontend_time_to_first_token_seconds_bucket",
        "tritonlm_preemptions_total",
        "tritonlm_router_outstanding",
        "nv_inference_request_success",
    ):
        assert family in queried
