"""The Kubernetes manifests: rendered (kustomize, or a small merge when no kustomize is installed),
validated offline against the Kubernetes schemas, and checked for what the sidecar layout relies on.

tsproxy's own config loader reads the rendered tsproxy.toml plus the TSPROXY_* variables the pod gets,
so a setting the server would refuse fails here, not in a cluster.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from deploy_tools import DEPLOY, REPO, find_tool

from tsproxy import config
from tsproxy.format.keyring import check_private

KUBERNETES = DEPLOY / "kubernetes"
TARGETS = {"base": KUBERNETES / "base", "s3": KUBERNETES / "overlays" / "s3"}
# Native sidecars (restartPolicy: Always on an init container) are on by default from 1.29, GA in 1.33.
KUBERNETES_VERSION = "1.33"
SECRET = "tsproxy-secrets"
SECRET_KEYS = {
    "client-access-key",
    "client-secret-key",
    "backend-access-key",
    "backend-secret-key",
    "keyring.json",
}

Doc = dict[str, Any]


# -- rendering -----------------------------------------------------------------------------------------------


def _kustomize_command() -> list[str] | None:
    kubectl = find_tool("kubectl")
    if kubectl:
        return [kubectl, "kustomize"]
    kustomize = find_tool("kustomize")
    return [kustomize, "build"] if kustomize else None


def _render_with_kustomize(command: list[str], target: Path) -> list[Doc]:
    run = subprocess.run([*command, str(target)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge as far as these manifests need it: maps merge, lists of named maps merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    named = isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(i, dict) and "name" in i for i in [*base, *patch]):
        merged = [copy.deepcopy(i) for i in base]
        for item in patch:
            at = next((n for n, b in enumerate(merged) if b["name"] == item["name"]), None)
            if at is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[at] = _merge(merged[at], item)
        return merged
    return copy.deepcopy(patch)


def _render_by_merge(target: Path) -> list[Doc]:
    """kustomize's resources, patches (strategic merge, matched by kind and name) and images."""
    kustomization = yaml.safe_load((target / "kustomization.yaml").read_text(encoding="utf-8"))
    known = {"apiVersion", "kind", "resources", "patches", "images"}
    assert set(kustomization) <= known, f"the fallback renderer does not know {set(kustomization) - known}"
    docs: list[Doc] = []
    for resource in kustomization.get("resources", []):
        path = target / resource
        if path.is_dir():
            docs.extend(_render_by_merge(path))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    for patch in kustomization.get("patches", []):
        assert set(patch) == {"path"}, patch
        for p in yaml.safe_load_all((target / patch["path"]).read_text(encoding="utf-8")):
            at = [
                n
                for n, d in enumerate(docs)
                if (d["kind"], d["metadata"]["name"]) == (p["kind"], p["metadata"]["name"])
            ]
            assert len(at) == 1, f"patch {patch['path']} matches {len(at)} resources"
            docs[at[0]] = _merge(docs[at[0]], p)
    images = {
        i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in kustomization.get("images", [])
    }
    for doc in docs:
        for c in _containers(doc):
            c["image"] = images.get(c["image"], c["image"])
    return docs


def render(target: Path) -> list[Doc]:
    """The manifests of a kustomization directory."""
    command = _kustomize_command()
    return _render_with_kustomize(command, target) if command else _render_by_merge(target)


def _containers(doc: Doc) -> list[Doc]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture(scope="module", params=sorted(TARGETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    return request.param, render(TARGETS[request.param])


# -- the renderer itself ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fallback_renderer_agrees_with_kustomize(name: str) -> None:
    command = _kustomize_command()
    if command is None:
        pytest.skip(
            "neither kubectl nor kustomize is installed: nothing to compare the fallback renderer with"
        )
    real = _render_with_kustomize(command, TARGETS[name])
    merged = _render_by_merge(TARGETS[name])

    def key(d: Doc) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted(real, key=key) == sorted(merged, key=key)


# -- schema validation ------------------------------------------------------------------------------------


def test_every_manifest_is_valid(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceMonitor"} <= kinds
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: no schema offline; checked by hand below
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_validation_rejects_a_broken_manifest(rendered: tuple[str, list[Doc]]) -> None:
    """The validator is strict: a misspelt field fails (so the test above can fail)."""
    broken = copy.deepcopy(_one(rendered[1], "StatefulSet", "kafka"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_service_monitor_selects_the_metrics_service(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    (monitor,) = _by_kind(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["metadata"]["name"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    services = [s for s in _by_kind(docs, "Service") if wanted.items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in services] == ["tsproxy-metrics"]
    ports = {p["name"]: p for p in services[0]["spec"]["ports"]}
    assert monitor["spec"]["endpoints"], "a ServiceMonitor needs endpoints"
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        # The alert rules and the dashboard expect job="tsproxy".
        assert {"targetLabel": "job", "replacement": "tsproxy"} in endpoint["relabelings"]
    assert ports["metrics"]["targetPort"] == "metrics"


def test_services_and_budget_select_the_broker_pods(rendered: tuple[str, list[Doc]]) -> None:
    _, docs = rendered
    pod_labels = _one(docs, "StatefulSet", "kafka")["spec"]["template"]["metadata"]["labels"]
    for service in _by_kind(docs, "Service"):
        assert service["spec"]["selector"].items() <= pod_labels.items(), service["metadata"]["name"]
    (pdb,) = _by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


# -- the sidecar layout -----------------------------------------------------------------------------------


def _pod(docs: list[Doc]) -> Doc:
    spec: Doc = _one(docs, "StatefulSet", "kafka")["spec"]["template"]["spec"]
    return spec


def _container(pod: Doc, name: str) -> Doc:
    found = [c for c in [*pod.get("initContainers", []), *pod["containers"]] if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def _built_image_name() -> str:
    spec = importlib.util.spec_from_file_location("tsproxy_image_build", REPO / "deploy/image/build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    name: str = build.image_name("fast")
    assert name.endswith(":" + build.version())
    return name.removeprefix("localhost/")


def _port(container: Doc, name: str) -> int:
    port: int = next(p["containerPort"] for p in container["ports"] if p["name"] == name)
    return port


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def test_tsproxy_is_a_native_sidecar_with_probes_and_resources(rendered: tuple[str, list[Doc]]) -> None:
    pod = _pod(rendered[1])
    tsproxy = _container(pod, "tsproxy")
    assert tsproxy in pod["initContainers"] and tsproxy["restartPolicy"] == "Always"
    # The name and tag the image build gives the server image (deploy/image/build.py, `make image`).
    assert tsproxy["image"] == _built_image_name()
    # It must come before nothing that needs it: only the plugin download may run before it.
    assert [c["name"] for c in pod["initContainers"]][-1] == "tsproxy"
    assert _port(tsproxy, "metrics") == 9102 and _port(tsproxy, "s3") == 9000
    paths = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = tsproxy[probe]["httpGet"]
        assert get["port"] == "metrics", probe
        paths[probe] = get["path"]
    assert paths == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    # /readyz waits up to 5 s for the backend: the probe must wait longer.
    assert tsproxy["readinessProbe"]["timeoutSeconds"] > 5
    for c in [*pod["initContainers"], *pod["containers"]]:
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
        assert "memory" in c["resources"]["limits"], c["name"]
    assert tsproxy["securityContext"]["runAsNonRoot"] and tsproxy["securityContext"]["readOnlyRootFilesystem"]
    assert pod["enableServiceLinks"] is False


def test_secrets_come_from_one_secret_with_documented_keys(rendered: tuple[str, list[Doc]]) -> None:
    pod = _pod(rendered[1])
    used = set()
    for c in [*pod["initContainers"], *pod["containers"]]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == SECRET, e["name"]
                used.add(ref["key"])
    for volume in pod["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["secretName"] == SECRET
            used |= {item["key"] for item in volume["secret"]["items"]}
    assert used == SECRET_KEYS
    readme = (KUBERNETES / "README.md").read_text(encoding="utf-8")
    for key in SECRET_KEYS:
        assert key in readme, f"README does not say how to create the secret key {key}"
    # No Secret with real or placeholder values is shipped.
    assert not _by_kind(rendered[1], "Secret")


def _tsproxy_config(docs: list[Doc], tmp_path: Path) -> tuple[config.Config, Doc, Doc]:
    """Load the pod's tsproxy configuration with tsproxy's own loader: TOML file plus pod environment."""
    pod = _pod(docs)
    tsproxy = _container(pod, "tsproxy")
    assert tsproxy["command"] == ["tsproxy", "serve"]
    args = tsproxy["args"]
    config_path = Path(args[args.index("--config") + 1])
    mounts = {m["mountPath"]: m for m in tsproxy["volumeMounts"]}
    mount = mounts[str(config_path.parent)]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = _one(docs, "ConfigMap", volume["configMap"]["name"])
    toml_file = tmp_path / config_path.name
    toml_file.write_text(config_map["data"][config_path.name], encoding="utf-8")
    env: dict[str, str] = {}
    for source in tsproxy.get("envFrom", []):
        env.update(_one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for name, e in _env(tsproxy).items():
        env[name] = e.get("value", f"secret-{name.lower()}")  # a stand-in for the secret's value
    cfg = config.load({}, env=env, config_file=toml_file)
    return cfg, pod, tsproxy


def test_tsproxy_config_loads_and_matches_the_pod(rendered: tuple[str, list[Doc]], tmp_path: Path) -> None:
    name, docs = rendered
    cfg, _, tsproxy = _tsproxy_config(docs, tmp_path)
    assert not cfg.dev_mode and cfg.encryption and cfg.credentials
    mounts = {m["mountPath"]: m for m in tsproxy["volumeMounts"]}
    # The cache on its own volume, the key ring from the Secret, ports as declared and probed.
    assert cfg.cache_dir is not None and str(cfg.cache_dir) in mounts
    assert not mounts[str(cfg.cache_dir)].get("readOnly")
    claims = {
        t["metadata"]["name"] for t in _one(docs, "StatefulSet", "kafka")["spec"]["volumeClaimTemplates"]
    }
    assert mounts[str(cfg.cache_dir)]["name"] in claims
    assert cfg.key_ring is not None and str(cfg.key_ring.parent) in mounts
    assert cfg.metrics_listen == ("0.0.0.0", _port(tsproxy, "metrics"))
    # Only the broker in the pod reaches the S3 API.
    assert cfg.listen == ("127.0.0.1", _port(tsproxy, "s3"))
    if name == "s3":
        assert cfg.backend.startswith("https://") and not cfg.backend_path_style
        assert cfg.backend_bucket and cfg.backend_region
    else:
        assert cfg.backend.startswith("http://") and cfg.backend_path_style


def test_broker_points_its_remote_storage_at_its_sidecar(
    rendered: tuple[str, list[Doc]], tmp_path: Path
) -> None:
    cfg, pod, _ = _tsproxy_config(rendered[1], tmp_path)
    env = _env(_container(pod, "kafka"))

    def value(name: str) -> str:
        v: str = env[name]["value"]
        return v

    assert value("KAFKA_REMOTE_LOG_STORAGE_SYSTEM_ENABLE") == "true"
    assert (
        value("KAFKA_REMOTE_LOG_STORAGE_MANAGER_CLASS_NAME")
        == "io.aiven.kafka.tieredstorage.RemoteStorageManager"
    )
    assert (
        value("KAFKA_RSM_CONFIG_STORAGE_BACKEND_CLASS") == "io.aiven.kafka.tieredstorage.storage.s3.S3Storage"
    )
    endpoint = urlsplit(value("KAFKA_RSM_CONFIG_STORAGE_S3_ENDPOINT_URL"))
    assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "localhost", cfg.listen[1])
    assert value("KAFKA_RSM_CONFIG_STORAGE_S3_PATH_STYLE_ACCESS_ENABLED") == "true"
    assert value("KAFKA_RSM_CONFIG_STORAGE_S3_REGION") == cfg.region
    # tsproxy compresses and encrypts; the plugin must not.
    assert value("KAFKA_RSM_CONFIG_COMPRESSION_ENABLED") == "false"
    assert value("KAFKA_RSM_CONFIG_ENCRYPTION_ENABLED") == "false"
    assert int(value("KAFKA_RSM_CONFIG_CHUNK_SIZE")) == cfg.chunk_size
    assert int(value("KAFKA_RSM_CONFIG_STORAGE_S3_MULTIPART_UPLOAD_PART_SIZE")) >= 5 << 20
    # The broker signs with the credentials tsproxy accepts.
    tsproxy_env = _env(_container(pod, "tsproxy"))
    for broker_var, tsproxy_var in (
        ("KAFKA_RSM_CONFIG_STORAGE_AWS_ACCESS_KEY_ID", "TSPROXY_ACCESS_KEY"),
        ("KAFKA_RSM_CONFIG_STORAGE_AWS_SECRET_ACCESS_KEY", "TSPROXY_SECRET_KEY"),
    ):
        assert env[broker_var]["valueFrom"] == tsproxy_env[tsproxy_var]["valueFrom"]
    # The plugin's jars are on the broker's class path, from the volume the download step fills.
    class_path = value("KAFKA_REMOTE_LOG_STORAGE_MANAGER_CLASS_PATH")
    mounts = {m["mountPath"] for m in _container(pod, "kafka")["volumeMounts"]}
    assert all(any(entry.startswith(m + "/") for m in mounts) for entry in class_path.split(":"))


def test_kraft_quorum_matches_the_replicas(rendered: tuple[str, list[Doc]]) -> None:
    statefulset = _one(rendered[1], "StatefulSet", "kafka")
    env = _env(_container(_pod(rendered[1]), "kafka"))
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"]["value"].split(",")
    service = statefulset["spec"]["serviceName"]
    expected = [f"{i}@kafka-{i}.{service}:9093" for i in range(statefulset["spec"]["replicas"])]
    assert voters == expected
    assert (
        env["KAFKA_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    headless = _one(rendered[1], "Service", service)
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"]


def test_config_files_are_valid_toml() -> None:
    for path in KUBERNETES.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") == "ConfigMap":
                for key, text in doc.get("data", {}).items():
                    if key.endswith(".toml"):
                        tomllib.loads(text)


def test_key_ring_secret_mode_passes_the_startup_check(
    rendered: tuple[str, list[Doc]], tmp_path: Path
) -> None:
    """tsproxy refuses a key ring others may access; the Secret volume must give it one it accepts.

    Secret files belong to root; with an fsGroup the kubelet also gives that group read access (it ORs
    0440 into a read-only volume's files), which the check allows for a root-owned file, as PostgreSQL
    does for its key. Nothing in the manifests turns the check off.
    """
    _, docs = rendered
    cfg, pod, tsproxy = _tsproxy_config(docs, tmp_path)
    assert not cfg.allow_insecure_key_ring
    assert "TSPROXY_ALLOW_INSECURE_KEY_RING" not in _env(tsproxy)
    assert cfg.key_ring is not None
    mount = next(m for m in tsproxy["volumeMounts"] if m["mountPath"] == str(cfg.key_ring.parent))
    secret = next(v for v in pod["volumes"] if v["name"] == mount["name"])["secret"]
    item = next((i for i in secret.get("items", []) if i["path"] == cfg.key_ring.name), {})
    mode = item.get("mode", secret.get("defaultMode", 0o644))
    if pod.get("securityContext", {}).get("fsGroup") is not None:
        mode |= 0o440
    ring = tmp_path / "keyring.json"
    ring.write_text("{}")
    os.chmod(ring, mode)
    if os.getuid() == 0:
        check_private(ring)  # root's file, as the kubelet writes it
    assert mode & 0o037 == 0, oct(mode)  # no group write, nothing for others
