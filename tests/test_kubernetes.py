"""deploy/kubernetes/: schema-valid offline, a native sidecar, and one source for the rules.

No cluster runs here. The core objects are checked against the Kubernetes JSON schemas that
kubernetes-validate ships (strict: an unknown field fails), the Operator's objects against
the CRD schemas kept in deploy/kubernetes/schemas/, made strict the same way. The rest are
the invariants a schema cannot see: the sidecar really is a native sidecar, the PodMonitor
finds its port, the flags parse with replaywatch's own parser, and the generated rule and
dashboard objects equal what generate.py makes of dashboards/ now.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from agents.run import make_parser as trainer_parser
from harness.procs import PYTHON, free_port, get_json, get_text, wait_until
from replaywatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
BASE = KUBE / "base"
SCHEMAS = KUBE / "schemas"
ALERTS = ROOT / "dashboards" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "dashboards" / "grafana" / "replaywatch.json"

# Native sidecars (restartPolicy on an init container) are on by default from 1.29.
KUBERNETES_VERSIONS = ("1.29.0", latest_version())
CRD_SCHEMAS = {"PodMonitor": "podmonitor_v1.json", "PrometheusRule": "prometheusrule_v1.json"}


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("kube_generate", KUBE / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _manifest_files() -> list[Path]:
    return sorted(p for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")


def _objects() -> dict[str, dict[str, Any]]:
    """kind -> object, from every manifest in the base (one object of each kind)."""
    objects: dict[str, dict[str, Any]] = {}
    for path in _manifest_files():
        for obj in yaml.safe_load_all(path.read_text()):
            assert obj["kind"] not in objects, f"{path.name}: a second {obj['kind']}"
            objects[obj["kind"]] = obj
    return objects


def _pod(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objects["Job"]["spec"]["template"]


def _sidecar(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    [sidecar] = [c for c in _pod(objects)["spec"]["initContainers"] if c["name"] == "replaywatch"]
    return sidecar


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as `kubectl apply` (strict) does.

    An object schema that lists properties and neither allows more nor preserves unknown
    fields gets additionalProperties: false; the API server would drop or refuse them.
    """
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
        # Go's RE2 takes a flag group anywhere; Python's re only at the start.
        out["pattern"] = "(?i)^" + out["pattern"][len("^(?i)"):]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _validate_crd_object(obj: dict[str, Any]) -> None:
    schema = _strict(json.loads((SCHEMAS / CRD_SCHEMAS[obj["kind"]]).read_text()))
    jsonschema.validate(obj, schema, cls=jsonschema.Draft7Validator)


# --- One source of truth ---------------------------------------------------------------

def test_generated_manifests_equal_what_generate_py_makes_now() -> None:
    for path, text in _generator().render_all().items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: run python deploy/kubernetes/generate.py")


def test_generate_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    gen = _generator()
    gen.PROMETHEUS_RULE = tmp_path / "prometheusrule.yaml"
    gen.DASHBOARD_CONFIGMAP = tmp_path / "grafana-dashboard.yaml"
    gen.PROMETHEUS_RULE.write_text("stale\n")
    gen.DASHBOARD_CONFIGMAP.write_text(_generator().DASHBOARD_CONFIGMAP.read_text())
    assert gen.main(["--check"]) == 1
    assert gen.PROMETHEUS_RULE.read_text() == "stale\n"  # --check writes nothing
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0


def test_a_changed_source_makes_the_checked_in_files_stale(tmp_path: Path) -> None:
    gen = _generator()
    assert gen.main(["--check"]) == 0
    alerts = tmp_path / "alerts.yml"
    alerts.write_text(ALERTS.read_text().replace("for: 1m", "for: 90s", 1))
    dashboard = tmp_path / "replaywatch.json"
    dashboard.write_text(DASHBOARD.read_text().replace('"refresh": "10s"', '"refresh": "30s"'))
    for name, changed in (("ALERTS", alerts), ("DASHBOARD", dashboard)):
        gen = _generator()
        setattr(gen, name, changed)
        assert gen.main(["--check"]) == 1, f"a change to {name} went unnoticed"


def test_prometheus_rule_groups_equal_alerts_yml() -> None:
    rule = _objects()["PrometheusRule"]
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    assert len(rule["spec"]["groups"]) >= 1


@pytest.mark.slow  # needs the Debian prometheus package
def test_promtool_accepts_the_prometheus_rule_groups(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (make system-deps)")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": _objects()["PrometheusRule"]["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_dashboard_configmap_holds_the_dashboard_for_grafanas_sidecar() -> None:
    cm = _objects()["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"] == {"replaywatch.json": DASHBOARD.read_text()}
    assert json.loads(cm["data"]["replaywatch.json"])["uid"] == "replaywatch"


# --- Schemas -----------------------------------------------------------------------------

def test_kustomization_lists_every_manifest_and_nothing_else() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in _manifest_files()]
    assert set(_objects()) == {"Job", "PodMonitor", "PrometheusRule", "ConfigMap"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_validate_strictly_against_kubernetes_schemas(version: str) -> None:
    core = [o for o in _objects().values() if o["kind"] not in CRD_SCHEMAS]
    assert {o["kind"] for o in core} == {"Job", "ConfigMap"}
    for obj in core:
        kubernetes_validate.validate(obj, version, strict=True)
    # The check can fail: a misspelt field in the sidecar is refused.
    job = copy.deepcopy(_objects()["Job"])
    _sidecar({"Job": job})["restartpolicy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, version, strict=True)


def test_operator_objects_validate_against_the_kept_crd_schemas() -> None:
    objects = _objects()
    for kind in CRD_SCHEMAS:
        _validate_crd_object(objects[kind])
    monitor = copy.deepcopy(objects["PodMonitor"])
    monitor["spec"]["podMetricsEndpoints"][0]["portname"] = "replaywatch"
    with pytest.raises(jsonschema.ValidationError, match="portname"):
        _validate_crd_object(monitor)
    rule = copy.deepcopy(objects["PrometheusRule"])
    rule["spec"]["groups"][0]["rules"][0]["for"] = "one minute"
    with pytest.raises(jsonschema.ValidationError):
        _validate_crd_object(rule)


def test_crd_schemas_name_their_source() -> None:
    readme = (SCHEMAS / "README.md").read_text()
    assert re.search(r"\b[0-9a-f]{40}\b", readme), "the prometheus-operator commit"
    for name in CRD_SCHEMAS.values():
        assert name in readme
        assert json.loads((SCHEMAS / name).read_text())["properties"]["spec"]["type"] == "object"


def test_kubectl_kustomize_builds_the_same_objects() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed; the files themselves are validated above")
    done = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    built = {o["kind"]: o for o in yaml.safe_load_all(done.stdout)}
    assert built == _objects()  # a plain base: nothing added, nothing changed


def test_the_readme_overlay_sets_namespace_image_and_release_label(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    readme = (KUBE / "README.md").read_text()
    example = re.search(r"cat > my-job/kustomization.yaml <<'EOF'\n(.*?)\nEOF\n", readme, re.S)
    assert example, "the README's overlay example"
    # Kustomize takes only relative paths; the README's overlay sits beside deploy/.
    base = os.path.relpath(BASE, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        example.group(1).replace("../deploy/kubernetes/base", base))
    done = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    built = {o["kind"]: o for o in yaml.safe_load_all(done.stdout)}
    assert set(built) == set(_objects())
    for obj in built.values():
        assert obj["metadata"]["namespace"] == "training"
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod = _pod(built)
    assert {c["image"] for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]} == {
        "registry.example.com/replaywatch:0.1.0"}
    selector = built["PodMonitor"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    kubernetes_validate.validate(built["Job"], latest_version(), strict=True)
    _validate_crd_object(built["PodMonitor"])


# --- The native sidecar ------------------------------------------------------------------

def test_replaywatch_is_a_native_sidecar_of_a_job_that_completes() -> None:
    objects = _objects()
    spec = _pod(objects)["spec"]
    assert spec["restartPolicy"] in ("Never", "OnFailure")
    assert _sidecar(objects)["restartPolicy"] == "Always"
    assert "replaywatch" not in [c["name"] for c in spec["containers"]]
    assert [c["name"] for c in spec["containers"]] == ["trainer"]


def test_sidecar_flags_parse_and_point_at_the_trainer_over_loopback() -> None:
    objects = _objects()
    sidecar = _sidecar(objects)
    assert sidecar["command"][-2:] == ["-m", "replaywatch"]
    args = build_parser().parse_args(sidecar["args"])
    [trainer] = _pod(objects)["spec"]["containers"]
    trainer_args = trainer_parser().parse_args(trainer["args"])
    assert args.command == "watch"
    assert args.reverb == [f"127.0.0.1:{trainer_args.reverb_port}"]
    probe_host, probe_port = trainer_args.probe_listen.rsplit(":", 1)
    replay_host, replay_port = trainer_args.replay_probe_listen.rsplit(":", 1)
    assert probe_host == replay_host == "127.0.0.1"
    assert args.probe == [f"127.0.0.1:{trainer_args.reverb_port}=http://127.0.0.1:{port}"
                          for port in (probe_port, replay_port)]
    # The sidecar reads the Reverb server's process: the pod shares its process namespace.
    assert _pod(objects)["spec"]["shareProcessNamespace"] is True
    host, port = args.listen.rsplit(":", 1)
    assert host == "0.0.0.0"
    [named] = [p for p in sidecar["ports"] if p["name"] == "replaywatch"]
    assert named["containerPort"] == int(port)
    assert not args.protect_metrics and not args.protect_healthz  # open to Prometheus/kubelet


def test_sidecar_token_and_incident_log_live_on_mounted_volumes() -> None:
    objects = _objects()
    sidecar = _sidecar(objects)
    args = build_parser().parse_args(sidecar["args"])
    volumes = {v["name"]: v for v in _pod(objects)["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in sidecar["volumeMounts"]}
    assert "secret" in mounts[str(Path(args.token_file).parent)]
    assert "emptyDir" in mounts[str(Path(args.db).parent)]
    assert args.db == "/var/lib/replaywatch/incidents.sqlite3"


def test_sidecar_probes_resources_and_security_context() -> None:
    objects = _objects()
    sidecar = _sidecar(objects)
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert sidecar[probe]["httpGet"]["port"] == "replaywatch"
    for kind in ("requests", "limits"):
        assert set(sidecar["resources"][kind]) == {"cpu", "memory"}
    security = sidecar["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    pod_security = _pod(objects)["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] > 0


def test_pod_monitor_finds_the_sidecar_port_and_names_the_job_the_rules_expect() -> None:
    objects = _objects()
    monitor = objects["PodMonitor"]["spec"]
    labels = _pod(objects)["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    assert "matchExpressions" not in monitor["selector"]
    [endpoint] = monitor["podMetricsEndpoints"]
    assert endpoint["port"] in [p["name"] for p in _sidecar(objects)["ports"]]
    assert endpoint["path"] == "/metrics"
    # ReplaywatchSidecarDown reads up{job="..."} (or =~): the relabelling must produce that job.
    exprs = [r["expr"] for g in objects["PrometheusRule"]["spec"]["groups"] for r in g["rules"]]
    matchers = [m for e in exprs for m in re.findall(r'\bup\{[^}]*\bjob(=~?)"([^"]+)"', e)]
    assert matchers, "no rule reads up{job=...}"
    set_job = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    assert set_job
    for op, value in matchers:
        assert (re.fullmatch(value, set_job[-1]) if op == "=~" else value == set_job[-1])


def test_readme_names_the_command_that_regenerates_and_it_runs() -> None:
    assert "python deploy/kubernetes/generate.py" in (KUBE / "README.md").read_text()
    done = subprocess.run([sys.executable, "deploy/kubernetes/generate.py", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_sidecar_runs_with_the_manifest_flags(spawn: Any, tmp_path: Path) -> None:
    """The Job's exact flags, with only the pod's paths and port moved onto this machine.

    No Reverb runs at 127.0.0.1:8000 here: the sidecar must still serve, get ready (a poll
    cycle completes with the target down), keep /metrics open and the API behind the token.
    """
    sidecar = _sidecar(_objects())
    args = list(sidecar["args"])
    token = tmp_path / "token"
    token.write_text("k8s-test-token\n")
    port = free_port()
    moved = {"--listen": f"127.0.0.1:{port}", "--token-file": str(token),
             "--db": str(tmp_path / "incidents.sqlite3")}
    for flag, value in moved.items():
        args[args.index(flag) + 1] = value
    spawn([PYTHON, "-m", "replaywatch", *args], name="k8s-sidecar")
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: get_json(f"{base}/readyz", 1.0)[0] == 200, timeout_s=60)
    assert get_json(f"{base}/healthz", 2.0)[0] == 200
    status, text = get_text(f"{base}/metrics", 5.0)
    assert status == 200 and "replaywatch_target_up" in text
    assert get_json(f"{base}/api/v1/findings", 5.0)[0] == 401
    auth = {"Authorization": "Bearer k8s-test-token"}
    assert get_json(f"{base}/api/v1/findings", 5.0, headers=auth)[0] == 200
