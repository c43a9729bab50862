"""deploy/kubernetes/: every manifest validated against a current Kubernetes schema
(kubernetes-validate, offline), and the manifests agree with each other and with ckptfs
(the config in the ConfigMap loads, probes ask /healthz on a declared port, every Secret key
and volume referred to exists). No cluster runs here: docs/kubernetes.md says so."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ckptfs.config import config_from_dict
from ckptfs.metrics.exporter import HEALTH_PATH

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
# Custom resources that Kubernetes' own schema does not know: checked by hand below.
CRDS = {("monitoring.coreos.com/v1", "PodMonitor"),
        ("kustomize.config.k8s.io/v1beta1", "Kustomization")}


def documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def one(kind: str) -> dict[str, Any]:
    found = [d for _, d in documents() if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def test_there_are_the_manifests_an_operator_needs() -> None:
    kinds = {d["kind"] for _, d in documents()}
    assert {"Namespace", "ConfigMap", "Secret", "DaemonSet", "PodMonitor", "Job",
            "Kustomization"} <= kinds


@pytest.mark.parametrize("name,doc", [(n, d) for n, d in documents()
                                      if (d["apiVersion"], d["kind"]) not in CRDS],
                         ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_is_valid_for_current_kubernetes(name: str, doc: dict[str, Any]) -> None:
    version = kubernetes_validate.latest_version()
    # strict: a misspelt or misplaced field is an error, not silently dropped
    kubernetes_validate.validate(doc, version, strict=True)


def test_kustomization_applies_every_manifest_but_the_examples() -> None:
    kust = one("Kustomization")
    listed = set(kust["resources"])
    assert all((DEPLOY / r).is_file() for r in listed)
    examples = {"secrets.example.yaml", "training-job.yaml", "kustomization.yaml"}
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - examples


def container(ds: dict[str, Any]) -> dict[str, Any]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def test_the_configmaps_config_loads_as_ckptfs_config() -> None:
    data = one("ConfigMap")["data"]["config.toml"]
    cfg = config_from_dict(tomllib.loads(data))
    # the probes and Prometheus reach the metrics port from outside the pod
    assert cfg.metrics.address == "0.0.0.0:9464"
    ds = one("DaemonSet")
    ports = {p["name"]: p["containerPort"] for p in container(ds)["ports"]}
    assert ports["metrics"] == 9464
    # every local tier's directory lies on a volume of the pod
    mounts = [m["mountPath"] for m in container(ds)["volumeMounts"]]
    for tier in cfg.tiers:
        assert any(str(tier.path).startswith(m + "/") for m in mounts), tier.path
    # the KEK file is the key of the kek Secret, where that Secret is mounted
    kek = next(m for m in container(ds)["volumeMounts"] if m["name"] == "kek")
    secret = next(d for _, d in documents() if d["kind"] == "Secret"
                  and d["metadata"]["name"] == "ckptfs-kek")
    kek_file = cfg.governance.keys.kek_file
    assert kek_file is not None
    assert kek_file.parent == Path(kek["mountPath"])
    assert kek_file.name in secret["data"]


def test_daemonset_probes_mounts_and_secrets_fit_together() -> None:
    ds = one("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = container(ds)
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"][
        "labels"].items()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": HEALTH_PATH, "port": "metrics"}
    volumes = {v["name"] for v in spec["volumes"]}
    assert {m["name"] for m in c["volumeMounts"]} <= volumes
    ckpt = next(m for m in c["volumeMounts"] if m["mountPath"] == "/ckpt")
    assert ckpt["mountPropagation"] == "Bidirectional"
    assert c["securityContext"]["privileged"] is True  # Kubernetes demands it for Bidirectional
    env = {e["name"]: e for e in c["env"]}
    assert env["CKPTFS_MOUNT"]["value"] == "/ckpt"
    secrets = {d["metadata"]["name"]: {**d.get("data", {}), **d.get("stringData", {})}
               for _, d in documents() if d["kind"] == "Secret"}
    for e in c["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["key"] in secrets[ref["name"]], ref


def test_podmonitor_scrapes_the_daemonsets_metrics_port() -> None:
    pm, ds = one("PodMonitor"), one("DaemonSet")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pm["metadata"]["namespace"] == ds["metadata"]["namespace"]
    ports = {p["name"] for p in container(ds)["ports"]}
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert ports == {"metrics"}


def test_training_job_mounts_a_namespace_of_the_config_as_a_subpath() -> None:
    job = one("Job")
    cfg = config_from_dict(tomllib.loads(one("ConfigMap")["data"]["config.toml"]))
    train = job["spec"]["template"]["spec"]["containers"][0]
    ckpt = next(m for m in train["volumeMounts"] if m["mountPath"] == "/ckpt")
    declared = {str(ns.path).strip("/") for ns in cfg.governance.namespaces}
    assert ckpt["subPath"] in declared
    uid = job["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    ns = next(n for n in cfg.governance.namespaces if str(n.path).strip("/") == ckpt["subPath"])
    assert uid in ns.uids  # the job's user owns the namespace it writes
