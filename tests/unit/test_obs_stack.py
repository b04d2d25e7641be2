"""compose/, grafana/ and the Dockerfile, checked without Docker: files valid, targets and metrics real."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conveyor.app import App
from conveyor.middleware.metrics import exposition_registry
from conveyor.platform.queues import QUEUES
from conveyor.tasks.worker import InlineWorkers
from tests.support.obs_support import ROOT, settings
from tests.support.waiting import wait_for

COMPOSE = ROOT / "compose" / "docker-compose.yml"
PROMETHEUS = ROOT / "compose" / "prometheus.yml"
DASHBOARD = ROOT / "grafana" / "dashboards" / "conveyor.json"

#: Where each kind of conveyor service serves /metrics (CONVEYOR_API_PORT, CONVEYOR_METRICS_PORT).
API_PORT, WORKER_METRICS_PORT = 8000, 9191


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def prometheus() -> dict:
    return yaml.safe_load(PROMETHEUS.read_text())


def worker_services(compose) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items() if name.startswith("worker-")}


def test_compose_has_the_stack(compose):
    services = compose["services"]
    assert {"redis", "postgres", "migrate", "api", "scheduler", "prometheus", "grafana"} <= set(services)
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--maxmemory-policy noeviction" in redis_command
    assert services["migrate"]["command"] == ["conveyor", "migrate"] and services["migrate"]["restart"] == "no"
    assert services["scheduler"]["command"] == ["conveyor", "scheduler"]
    assert services["api"]["command"] == ["conveyor", "api"]
    assert services["api"]["environment"]["CONVEYOR_API_PORT"] == str(API_PORT)
    assert services["api"]["environment"]["CONVEYOR_API_HOST"] == "0.0.0.0"
    for name in ("api", "scheduler", *worker_services(compose)):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["redis"]["condition"] == "service_healthy", name
        env = services[name]["environment"]
        assert env["REDIS_URL"].startswith("redis://redis:") and "@postgres:" in env["DATABASE_URL"]
        assert env["CONVEYOR_ADMIN_TOKEN"].startswith("${CONVEYOR_ADMIN_TOKEN:?")  # never a default token
    build = services["api"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).is_file()


def test_one_worker_service_per_queue_with_its_queue_and_concurrency(compose):
    workers = worker_services(compose)
    assert set(workers) == {f"worker-{q}" for q in QUEUES}
    for queue, spec in QUEUES.items():
        service = workers[f"worker-{queue}"]
        assert service["command"] == ["conveyor", "worker", "--queues", queue]
        assert service["environment"][f"CONVEYOR_QUEUES__{queue.upper()}__CONCURRENCY"] == str(spec.concurrency)
        assert service["environment"]["CONVEYOR_METRICS_PORT"] == str(WORKER_METRICS_PORT)
        # Scalable with --scale: no fixed name, no host port.
        assert "container_name" not in service and "ports" not in service


def test_prometheus_scrapes_the_api_and_every_worker_on_their_ports(compose, prometheus):
    services = compose["services"]
    scraped: dict[str, int] = {}
    for job in prometheus["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                scraped[host] = int(port)
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A"
            for name in sd["names"]:
                scraped[name] = int(sd["port"])
    assert set(scraped) <= set(services), f"targets that are no service: {set(scraped) - set(services)}"
    expected = {"api": API_PORT, **{name: WORKER_METRICS_PORT for name in worker_services(compose)}}
    assert scraped == expected
    # The mounted config is this file, and Grafana's datasource points at this Prometheus.
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in services["prometheus"]["volumes"]
    datasource = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]


def test_grafana_is_provisioned_from_the_repo(compose):
    volumes = compose["services"]["grafana"]["volumes"]
    for volume in volumes:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            assert (COMPOSE.parent / source).is_dir(), source
    provider = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/conveyor.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert any(v.split(":")[1] == path for v in volumes)
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {"prometheus"}


def exported_sample_names(text: str) -> set[str]:
    """Every sample name a scrape can carry, from the families it declares (even those without samples yet)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
        "summary": ("_sum", "_count", ""),
    }
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_every_metric_the_dashboard_queries_is_exported(tmp_path):
    app = App(settings(broker="inline"))
    try:
        workers = InlineWorkers(app, ["indexing"]).start()
        try:
            refs = [
                app.jobs.enqueue("obs.work", {"n": 1}, key="k"),
                app.jobs.enqueue("obs.work", {"n": 1}, key="k"),
                app.jobs.enqueue("obs.work", {"n": 2, "fail_first": 1}),
                app.jobs.enqueue("obs.work", {"n": 3, "fail": True}),
            ]
            wait_for(
                lambda: all(app.broker.get_job(r.id).state in ("completed", "failed") for r in refs),
                message="the jobs to finish",
            )
            # What the API's /metrics serves: this process's counts plus queue depth from the broker.
            text = generate_latest(exposition_registry(app)).decode()
        finally:
            workers.stop()
    finally:
        app.close()
    exported = exported_sample_names(text)
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries.append(dashboard["templating"]["list"][0]["definition"])
    used = {name for q in queries for name in re.findall(r"\bconveyor_[a-z0-9_]+\b", q)}
    assert len(used) >= 15
    assert used - exported == set(), f"the dashboard queries metrics the code does not export: {used - exported}"
    # And the jobs above produced real samples of the main families.
    for name in (
        "conveyor_jobs_completed_total",
        "conveyor_jobs_retried_total",
        "conveyor_jobs_dead_total",
        "conveyor_jobs_deduplicated_total",
        "conveyor_job_wait_seconds_bucket",
        "conveyor_queue_depth",
    ):
        assert re.search(rf"^{name}{{", text, re.M), name


def test_the_dockerfile_installs_conveyor_and_drops_root():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install '?\.(\[otel\])?'?$", text, re.M) and "USER conveyor" in text
    for path in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / path).exists(), path
