"""deploy/kubernetes/ (issue 22, item 6), checked without a cluster: every object valid against the Kubernetes
schemas (kubernetes-validate ships them), the KEDA ScaledObjects against their CRD's shape, one worker Deployment
per queue with probes, drain and grace period that agree, and every metric the autoscalers read exported."""

from __future__ import annotations

import re
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conveyor.app import App
from conveyor.middleware.metrics import exposition_registry
from conveyor.platform.queues import QUEUES
from conveyor.settings import Settings, env_help
from tests.support.harness import ROOT

K8S = ROOT / "deploy" / "kubernetes"
#: The Kubernetes version whose schemas the manifests are checked against (the oldest we claim to support).
KUBERNETES_VERSION = "1.30.0"
#: The supervisor's own margin past CONVEYOR_SHUTDOWN_TIMEOUT before it SIGKILLs a stuck process
#: (conveyor.tasks.worker.Supervisor._shutdown): the pod's grace must cover both.
SUPERVISOR_MARGIN = 10

#: The part of KEDA's ScaledObject CRD (keda.sh/v1alpha1) these manifests use, with its required fields and types.
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer"},
                "advanced": {"type": "object"},
                "fallback": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {"type": "object"},
                            # KEDA reads every trigger metadata value as a string.
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                    },
                },
            },
        },
    },
}
#: What KEDA's prometheus scaler requires of its metadata.
PROMETHEUS_TRIGGER = {"serverAddress", "query", "threshold"}


def load(path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization) -> list[dict]:
    return [doc for resource in kustomization["resources"] for doc in load(K8S / resource)]


def of_kind(objects, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def workers(objects) -> dict[str, dict]:
    return {name: d for name, d in of_kind(objects, "Deployment").items() if name.startswith("conveyor-worker-")}


def config(objects) -> dict[str, str]:
    return of_kind(objects, "ConfigMap")["conveyor-config"]["data"]


def test_every_kubernetes_object_is_valid_against_the_schemas(objects):
    extra = load(K8S / "secret.example.yaml") + load(K8S / "hpa" / "hpa.yaml")
    checked = 0
    for obj in objects + extra:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: test_scaled_objects_have_keda_s_shape_and_target_each_worker
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 15


def test_a_broken_manifest_is_refused():
    """The check can fail: a misspelt field and a wrong type are refused."""
    (deployment,) = load(K8S / "scheduler.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["comand"] = ["conveyor"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    (scaled, *_) = load(K8S / "keda.yaml")
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 16
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, SCALED_OBJECT)


def test_the_kustomization_lists_real_files_and_the_image(kustomization):
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    assert "secret.example.yaml" not in kustomization["resources"]  # never an example secret applied
    assert [i["name"] for i in kustomization["images"]] == ["conveyor"]


def test_one_worker_deployment_per_queue_with_its_command_probes_and_drain(objects):
    deployments = workers(objects)
    assert set(deployments) == {f"conveyor-worker-{q}" for q in QUEUES}
    shared = config(objects)
    pdbs = of_kind(objects, "PodDisruptionBudget")
    for queue, spec in QUEUES.items():
        deployment = deployments[f"conveyor-worker-{queue}"]
        assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"] == ["conveyor", "worker", "--queues", queue]
        env = {**shared, **{e["name"]: e["value"] for e in container.get("env", [])}}
        assert env[f"CONVEYOR_QUEUES__{queue.upper()}__CONCURRENCY"] == str(spec.concurrency)
        # The kubelet's SIGKILL comes after the whole drain.
        drain = float(env["CONVEYOR_SHUTDOWN_TIMEOUT"])
        assert pod["terminationGracePeriodSeconds"] >= drain + SUPERVISOR_MARGIN, queue
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {
            "metrics": int(env["CONVEYOR_METRICS_PORT"]),
            "health": int(env["CONVEYOR_WORKER_HEALTH_PORT"]),
        }
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        assert env["CONVEYOR_METRICS_HOST"] == "0.0.0.0"  # scraped and probed from outside the pod
        assert pod["securityContext"]["runAsNonRoot"] is True
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"] == labels
        (pdb,) = [p for p in pdbs.values() if p["spec"]["selector"]["matchLabels"] == labels]
        assert pdb["spec"]["maxUnavailable"] == 1
    api = of_kind(objects, "Deployment")["conveyor-api"]
    api_labels = api["spec"]["template"]["metadata"]["labels"]
    assert of_kind(objects, "Service")["conveyor-api"]["spec"]["selector"] == api_labels
    assert any(p["spec"]["selector"]["matchLabels"] == api_labels for p in pdbs.values())


def test_the_build_workers_and_the_api_share_the_data_volume(objects):
    assert config(objects)["CONVEYOR_DATA_DIR"] == "/data"
    claim = of_kind(objects, "PersistentVolumeClaim")["conveyor-data"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    deployments = of_kind(objects, "Deployment")
    for name in ("conveyor-api", "conveyor-worker-build"):  # uploads written by the API, built by agent.build
        pod = deployments[name]["spec"]["template"]["spec"]
        (volume,) = [
            v for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == "conveyor-data"
        ]
        mounts = pod["containers"][0]["volumeMounts"]
        assert {"name": volume["name"], "mountPath": "/data"} in mounts, name


def test_every_configured_variable_is_a_setting(objects):
    known = {name for name, _ in env_help()} | {f"CONVEYOR_{n.upper()}" for n in Settings.model_fields}
    secret = load(K8S / "secret.example.yaml")[0]["stringData"]
    for name in [*config(objects), *secret]:
        assert name in known, name
    for deployment in workers(objects).values():
        for env in deployment["spec"]["template"]["spec"]["containers"][0].get("env", []):
            assert env["name"] in known or env["name"].startswith("CONVEYOR_QUEUES__"), env["name"]


def test_every_command_is_a_real_conveyor_command(objects):
    commands = {
        tuple(c["command"][:2])
        for o in objects
        if o["kind"] in ("Deployment", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert {c[1] for c in commands} == {"api", "worker", "scheduler", "migrate"}
    for _, sub in commands:
        done = subprocess.run([sys.executable, "-m", "conveyor", sub, "--help"], capture_output=True, timeout=60)
        assert done.returncode == 0, (sub, done.stderr[-500:])


def exported_families() -> dict[str, set[str]]:
    """Every metric family what Prometheus scrapes from conveyor carries (the API's /metrics: its counts plus
    the queue depth it reads from the broker), with the label names of its samples."""
    app = App(Settings(broker="inline"))
    try:
        text = generate_latest(exposition_registry(app)).decode()
    finally:
        app.close()
    families: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        families.setdefault(family.name, set()).update(label for s in family.samples for label in s.labels)
    return families


METRIC = re.compile(r"\bconveyor_[a-z_]+\b")
SELECTOR = re.compile(r"(conveyor_[a-z_]+)\{([^}]*)\}")


def test_scaled_objects_have_keda_s_shape_and_target_each_worker(objects):
    scaled = of_kind(objects, "ScaledObject")
    deployments = workers(objects)
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled.values()} == set(deployments)
    for obj in scaled.values():
        jsonschema.validate(obj, SCALED_OBJECT)
        spec = obj["spec"]
        assert spec["minReplicaCount"] >= 1  # a worker stays up: cron fires and retries land on it
        assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
        queue = deployments[spec["scaleTargetRef"]["name"]]["metadata"]["labels"]["conveyor.dev/queue"]
        for trigger in spec["triggers"]:
            assert trigger["type"] == "prometheus"
            assert PROMETHEUS_TRIGGER <= set(trigger["metadata"])
            float(trigger["metadata"]["threshold"])
            assert f'queue="{queue}"' in trigger["metadata"]["query"]
        queries = " ".join(t["metadata"]["query"] for t in spec["triggers"])
        assert "conveyor_queue_depth" in queries and "conveyor_queue_oldest_waiting_seconds" in queries


def test_the_autoscalers_read_only_metrics_and_labels_conveyor_exports(objects):
    families = exported_families()
    used: dict[str, set[str]] = {}
    for obj in of_kind(objects, "ScaledObject").values():
        for trigger in obj["spec"]["triggers"]:
            query = trigger["metadata"]["query"]
            for name in METRIC.findall(query):
                used.setdefault(name, set())
            for name, matchers in SELECTOR.findall(query):
                used[name].update(m.split("=")[0].strip().rstrip("!~") for m in matchers.split(",") if m)
    for hpa in load(K8S / "hpa" / "hpa.yaml"):
        for metric in hpa["spec"]["metrics"]:
            selected = metric["external"]["metric"]
            used.setdefault(selected["name"], set()).update(selected["selector"]["matchLabels"])
    rules = (K8S / "hpa" / "prometheus-adapter-rules.yaml").read_text()
    for name in METRIC.findall(rules):
        used.setdefault(name, set())
    assert set(used) == {"conveyor_queue_depth", "conveyor_queue_oldest_waiting_seconds"}
    for name, labels in used.items():
        assert name in families, f"{name} is not exported"
        assert labels <= families[name], f"{name} has no label(s) {labels - families[name]}"
