"""Static checks of the Helm chart, alert rules and dashboards (no cluster needed).

Needs helm (tools/bin/helm, from `make k8s-tools`) and promtool (installed by the same script). Missing tools
FAIL with that instruction rather than skipping: a green run means every check really ran.

Schema validation: every rendered manifest is validated with kubernetes-validate (strict) against
K8S_VERSION, except the CRD kinds in CRD_KINDS (Prometheus operator, KEDA), whose schemas kubernetes-validate
does not ship; those are checked only for apiVersion/kind/metadata/spec shape.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "scalerl"
GPU_EXAMPLE = CHART / "examples" / "gpu-cluster.yaml"
ALERTS = CHART / "files" / "alerts.rules.yaml"
DASHBOARDS = CHART / "dashboards"
METRICS_FILE = Path(__file__).with_name("exported_metrics.txt")
K8S_VERSION = os.environ.get("SCALERL_K8S_VERSION", kubernetes_validate.latest_version())
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}
# The APIs of the CRD-backed kinds, as a cluster with the Prometheus operator and KEDA serves them.
CRD_APIS = [a for api, kind in sorted(CRD_KINDS) for a in ("--api-versions", f"{api}/{kind}")]
ALL_FEATURES = [
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.prometheusRule.enabled=true",
    "--set", "autoscaling.enabled=true",
    *CRD_APIS,
]
VARIANTS = {
    "default": [],
    "gpu-cluster": ["-f", str(GPU_EXAMPLE)],
    "all-features": ALL_FEATURES,
    "hpa": ALL_FEATURES + ["--set", "autoscaling.mode=hpa"],
    "pod-monitor": ["--set", "metrics.podMonitor.enabled=true", *CRD_APIS],
    "no-service-account": ["--set", "serviceAccount.create=false"],
    "external-stores": [
        "--set", "redis.external.url=redis://r:6379/0",
        "--set", "postgres.enabled=false",
        "--set", "postgres.external.url=postgresql+psycopg://u:p@db:5432/scalerl",
        "--set", "auth.existingSecret=tok",
        "--set", "persistence.existingClaim=ckpt",
    ],
}


def tool(name: str) -> str:
    local = ROOT / "tools" / "bin" / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found (looked in tools/bin and PATH): run `make k8s-tools`", pytrace=False)
    return found


def run(*cmd: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def render(args: list[str]) -> list[dict]:
    out = run(tool("helm"), "template", "rel", str(CHART), "--namespace", "scalerl", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def manifests(request) -> tuple[str, list[dict]]:
    return request.param, render(VARIANTS[request.param])


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


# ------------------------------------------------------------------ helm lint / template / validate
@pytest.mark.parametrize("values", [[], ["-f", str(GPU_EXAMPLE)], ALL_FEATURES[: -len(CRD_APIS)]])  # lint: no --api-versions
def test_helm_lint(values):
    run(tool("helm"), "lint", "--strict", str(CHART), *values)


def test_manifests_validate_against_kubernetes_schema(manifests):
    name, docs = manifests
    assert docs, f"{name}: nothing rendered"
    errors = []
    for d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        if key in CRD_KINDS:  # no schema shipped with kubernetes-validate: shape check only
            assert d["metadata"].get("name") and isinstance(d.get("spec"), dict), key
            continue
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{key} {d['metadata'].get('name')}: {e.message} at {list(e.path)}")
    assert not errors, f"{name}: " + "\n".join(errors)


def test_every_service_has_workload_service_and_grpc_probes(manifests):
    name, docs = manifests
    deps = by_kind(docs, "Deployment")
    svcs = by_kind(docs, "Service")
    for comp in ["api", "generator", "evaluator", "reward-grader", "replay-buffer", "learner", "forecaster",
                 "weight-broadcast"]:
        dep = deps[f"rel-scalerl-{comp}"]
        assert f"rel-scalerl-{comp}" in svcs
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["command"][0] == "scalerl-serve"
        assert "grpc" in c["livenessProbe"], comp
        if comp != "api":
            assert "grpc" in c["readinessProbe"], comp
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["allowPrivilegeEscalation"]
        assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert deps["rel-scalerl-learner"]["spec"]["strategy"]["type"] == "Recreate"
    assert deps["rel-scalerl-learner"]["spec"]["replicas"] == 1
    env = {e["name"]: e for e in deps["rel-scalerl-evaluator"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SCALERL_GENERATOR_ROLE"]["value"] == "evaluator"
    evaluator = deps["rel-scalerl-evaluator"]["spec"]["template"]["spec"]["containers"][0]
    assert evaluator["command"] == ["scalerl-serve", "generator"]


def test_gpu_components_are_scheduled_on_gpu_nodes(manifests):
    name, docs = manifests
    deps = by_kind(docs, "Deployment")
    for comp in ["generator", "evaluator", "learner"]:
        spec = deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]
        c = spec["containers"][0]
        assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        assert spec["tolerations"]
        if name == "gpu-cluster":
            assert spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        shm = [v for v in spec["volumes"] if v["name"] == "dshm"][0]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        if name == "gpu-cluster":
            assert spec["runtimeClassName"] == "nvidia"
    for comp in ["api", "reward-grader", "replay-buffer", "forecaster", "weight-broadcast"]:
        c = deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {})


def test_stores(manifests):
    name, docs = manifests
    sts = by_kind(docs, "StatefulSet")
    buffer_env = {e["name"]: e for e in by_kind(docs, "Deployment")["rel-scalerl-replay-buffer"]["spec"]["template"]
                  ["spec"]["containers"][0]["env"]}
    api_env = {e["name"]: e for e in by_kind(docs, "Deployment")["rel-scalerl-api"]["spec"]["template"]["spec"]
               ["containers"][0]["env"]}
    assert "SCALERL_DATABASE_URL" in api_env
    if name == "external-stores":
        assert not sts
        assert buffer_env["REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "redis-url"
        assert api_env["SCALERL_API_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "tok"
        return
    redis = sts["rel-scalerl-redis"]
    assert redis["spec"]["volumeClaimTemplates"]
    conf = by_kind(docs, "ConfigMap")["rel-scalerl-redis"]["data"]["valkey.conf"]
    assert "appendonly yes" in conf
    assert buffer_env["REDIS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@rel-scalerl-redis:6379/0"


def test_network_policies_expose_only_the_api(manifests):
    _, docs = manifests
    for np_name, np in by_kind(docs, "NetworkPolicy").items():
        for rule in np["spec"]["ingress"]:
            ports = {p["port"] for p in rule["ports"]}
            peers = rule.get("from")
            if peers is None or any("ipBlock" in p for p in peers):
                assert np_name == "rel-scalerl-api" and ports == {"http"}, np_name
            for peer in peers or []:
                if "namespaceSelector" in peer and "podSelector" not in peer:
                    assert ports <= {"metrics", "http"}, (np_name, rule)


def test_pdbs_and_rbac(manifests):
    _, docs = manifests
    pdbs = by_kind(docs, "PodDisruptionBudget")
    assert "rel-scalerl-generator" in pdbs and "rel-scalerl-api" in pdbs
    role = by_kind(docs, "Role")["rel-scalerl-api"]
    scale_rule = [r for r in role["rules"] if r["resources"] == ["deployments/scale"]][0]
    assert scale_rule["resourceNames"] == ["rel-scalerl-generator"] and "patch" in scale_rule["verbs"]


def test_dashboards_and_monitoring_objects():
    docs = render(ALL_FEATURES)
    cms = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert {k for cm in cms for k in cm["data"]} == {p.name for p in DASHBOARDS.glob("*.json")}
    rule = [d for d in docs if d["kind"] == "PrometheusRule"][0]
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    kinds = {d["kind"] for d in docs}
    assert {"ServiceMonitor", "ScaledObject"} <= kinds
    assert "PodMonitor" in {d["kind"] for d in render(VARIANTS["pod-monitor"])}
    assert "HorizontalPodAutoscaler" in {d["kind"] for d in render(VARIANTS["hpa"])}


def test_invalid_values_rejected_by_schema():
    proc = subprocess.run([tool("helm"), "template", "rel", str(CHART), "--set", "learner.replicas=2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "learner" in proc.stderr
    proc = subprocess.run([tool("helm"), "template", "rel", str(CHART), "--set", "postgres.enabled=false"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "postgres" in proc.stderr


# ------------------------------------------------------------------ alerts and dashboards
def test_promtool_check_rules():
    run(tool("promtool"), "check", "rules", str(ALERTS))


def test_dashboards_are_fresh():
    run(str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else "python",
        str(ROOT / "scripts" / "gen_dashboards.py"), "--check")


def dashboard_exprs() -> list[str]:
    exprs = []
    paths = sorted(DASHBOARDS.glob("*.json"))
    assert paths, "no dashboards in helm/scalerl/dashboards"
    for path in paths:
        dash = json.loads(path.read_text())  # must parse
        assert dash["uid"] and dash["title"] and dash["panels"]
        for panel in dash["panels"]:
            exprs += [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
        exprs += [v["query"] for v in dash.get("templating", {}).get("list", []) if isinstance(v.get("query"), str)]
    return exprs


def alert_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def exported() -> set[str]:
    names = {ln.strip() for ln in METRICS_FILE.read_text().splitlines() if ln.strip() and not ln.startswith("#")}
    assert len(names) >= 30
    return names


METRIC_RE = re.compile(r"\bscalerl_[a-z0-9_]+")


def family(name: str, known: set[str]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in known:
            return name[: -len(suffix)]
    return name


@pytest.mark.parametrize("source", ["dashboards", "alerts"])
def test_every_metric_used_is_exported(source):
    known = exported()
    exprs = dashboard_exprs() if source == "dashboards" else alert_exprs()
    used = {family(m, known) for e in exprs for m in METRIC_RE.findall(e)}
    assert used, f"no scalerl_ metrics found in {source}"
    unknown = sorted(used - known)
    assert not unknown, f"{source} use metrics no service exports (helm/tests/exported_metrics.txt): {unknown}"


def test_autoscaler_query_uses_exported_metrics():
    known = exported()
    docs = render(ALL_FEATURES)
    so = [d for d in docs if d["kind"] == "ScaledObject"][0]
    q = so["spec"]["triggers"][0]["metadata"]["query"]
    used = {family(m, known) for m in METRIC_RE.findall(q)}
    assert used and used <= known, used - known


# ------------------------------------------------------------------ chart hygiene (issue 16)
COMPONENTS = ["api", "generator", "evaluator", "reward-grader", "replay-buffer", "learner", "forecaster",
              "weight-broadcast"]
VALUE_KEYS = ["api", "generator", "evaluator", "rewardGrader", "replayBuffer", "learner", "forecaster",
              "weightBroadcast"]


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    """Every pod template (and bare Pod) of a render, by object name."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out[d["metadata"]["name"]] = d["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            out[d["metadata"]["name"]] = d["spec"]
    return out


def validate(docs: list[dict]) -> None:
    for d in docs:
        if (d.get("apiVersion"), d.get("kind")) not in CRD_KINDS:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def render_fails(*args: str) -> str:
    proc = subprocess.run([tool("helm"), "template", "rel", str(CHART), "--namespace", "scalerl", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, f"rendered although it should not: {args}"
    return proc.stderr


def test_pods_reference_service_accounts_that_exist(manifests):
    _, docs = manifests
    accounts = set(by_kind(docs, "ServiceAccount")) | {"default"}
    for name, spec in pod_specs(docs).items():
        assert spec.get("serviceAccountName", "default") in accounts, name


def test_service_account_name_is_used_when_not_created():
    docs = render(["--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ml-runner"])
    assert not by_kind(docs, "ServiceAccount")
    deps = by_kind(docs, "Deployment")
    for comp in COMPONENTS:
        assert deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]["serviceAccountName"] == "ml-runner", comp
    binding = by_kind(docs, "RoleBinding")["rel-scalerl-api"]
    assert binding["subjects"][0]["name"] == "ml-runner"


def test_gpu_pods_have_no_node_selector_by_default():
    deps = by_kind(render([]), "Deployment")
    for comp in ["generator", "evaluator", "learner"]:
        assert "nodeSelector" not in deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"], comp


def test_per_component_scheduling_env_and_volumes():
    args = []
    for key in VALUE_KEYS:
        args += [
            "--set", f"{key}.priorityClassName=scalerl-high",
            "--set", f"{key}.schedulerName=volcano",
            "--set", f"{key}.topologySpreadConstraints[0].maxSkew=1",
            "--set", f"{key}.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
            "--set", f"{key}.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
            "--set", f"{key}.extraEnv[0].name=EXTRA_{key.upper()}",
            "--set-string", f"{key}.extraEnv[0].value=1",
            "--set", f"{key}.extraVolumes[0].name=extra",
            "--set", f"{key}.extraVolumes[0].emptyDir.medium=Memory",
            "--set", f"{key}.extraVolumeMounts[0].name=extra",
            "--set", f"{key}.extraVolumeMounts[0].mountPath=/extra",
        ]
    docs = render(args)
    validate(docs)
    deps = by_kind(docs, "Deployment")
    for key, comp in zip(VALUE_KEYS, COMPONENTS):
        spec = deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]
        assert spec["priorityClassName"] == "scalerl-high" and spec["schedulerName"] == "volcano", comp
        assert spec["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone", comp
        c = spec["containers"][0]
        assert {"name": f"EXTRA_{key.upper()}", "value": "1"} in c["env"], comp
        assert {"name": "extra", "mountPath": "/extra"} in c["volumeMounts"], comp
        assert {"name": "extra", "emptyDir": {"medium": "Memory"}} in spec["volumes"], comp


def test_crd_objects_render_only_where_their_api_is_served():
    wanted = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
              "--set", "autoscaling.enabled=true"]
    bare = render(wanted)
    assert not {d["kind"] for d in bare} & {kind for _, kind in CRD_KINDS}
    # Without KEDA nothing scales the generators: the Deployment keeps its replica count.
    assert by_kind(bare, "Deployment")["rel-scalerl-generator"]["spec"]["replicas"] == 2
    served = render(wanted + CRD_APIS)
    assert {"ServiceMonitor", "PrometheusRule", "ScaledObject"} <= {d["kind"] for d in served}
    assert "replicas" not in by_kind(served, "Deployment")["rel-scalerl-generator"]["spec"]


def test_service_monitor_and_pod_monitor_are_exclusive():
    err = render_fails("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true")
    assert "serviceMonitor or podMonitor" in err


def test_runbook_urls_are_absolute_and_point_at_a_runbook_section():
    docs = render(ALL_FEATURES + ["--set", "metrics.prometheusRule.runbookBaseUrl=https://wiki.example.com/ops"])
    rule = [d for d in docs if d["kind"] == "PrometheusRule"][0]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for r in alerts:
        assert r["annotations"]["runbook_url"] == f"https://wiki.example.com/ops#{r['alert'].lower()}"
    sections = {ln[4:].strip().lower() for ln in (ROOT / "docs" / "operations.md").read_text().splitlines()
                if ln.startswith("### ")}
    for r in yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"] + \
            yaml.safe_load(ALERTS.read_text())["groups"][1]["rules"]:
        assert re.match(r"^https://", r["annotations"]["runbook_url"]), r["alert"]
        assert r["alert"].lower() in sections, f"docs/operations.md has no section for {r['alert']}"
    assert "runbookBaseUrl" in render_fails(*ALL_FEATURES, "--set", "metrics.prometheusRule.runbookBaseUrl=docs/x")


def test_helm_test_pod_checks_every_service():
    docs = render([])
    pod = by_kind(docs, "Pod")["rel-scalerl-test-health"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    script, targets, http = c["args"]
    assert "check_health" in script and "urlopen" in script
    deps = by_kind(docs, "Deployment")
    expected = set()
    for comp in COMPONENTS:
        grpc_port = [p for p in deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]["containers"][0]["ports"]
                     if p["name"] == "grpc"][0]["containerPort"]
        expected.add(f"rel-scalerl-{comp}:{grpc_port}")
    assert set(targets.split(",")) == expected
    assert http == "http://rel-scalerl-api:8000/healthz"
    # The release's NetworkPolicies admit it (it carries the release selector labels).
    assert {"app.kubernetes.io/name": "scalerl", "app.kubernetes.io/instance": "rel"}.items() <= \
        pod["metadata"]["labels"].items()


def test_forecaster_points_are_on_a_volume():
    docs = render([])
    dep = by_kind(docs, "Deployment")["rel-scalerl-forecaster"]
    data = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "data"][0]
    assert data["persistentVolumeClaim"]["claimName"] == "rel-scalerl-forecaster"
    assert "rel-scalerl-forecaster" in by_kind(docs, "PersistentVolumeClaim")
    assert dep["spec"]["strategy"]["type"] == "Recreate"  # RWO volume: the old pod lets go first


def test_valkey_memory_password_and_durability():
    docs = render([])
    conf = by_kind(docs, "ConfigMap")["rel-scalerl-redis"]["data"]["valkey.conf"]
    settings = dict(ln.split(" ", 1) for ln in conf.splitlines() if ln and not ln.startswith("#"))
    assert int(settings["maxmemory"]) == int(0.6 * 4 * 2**30)
    assert settings["maxmemory-policy"] == "noeviction"
    assert settings["appendfsync"] == "always"
    secret = by_kind(docs, "Secret")["rel-scalerl-redis"]
    assert secret["data"]["password"]
    valkey = by_kind(docs, "StatefulSet")["rel-scalerl-redis"]["spec"]["template"]["spec"]["containers"][0]
    assert valkey["args"] == ["--requirepass", "$(REDIS_PASSWORD)"]
    env = {e["name"]: e for e in valkey["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "rel-scalerl-redis", "key": "password"}
    buffer_env = [e["name"] for e in by_kind(docs, "Deployment")["rel-scalerl-replay-buffer"]["spec"]["template"]
                  ["spec"]["containers"][0]["env"]]
    assert buffer_env.index("REDIS_PASSWORD") < buffer_env.index("REDIS_URL")  # $(VAR) needs it defined first
    sized = by_kind(render(["--set", "redis.resources.limits.memory=10Gi"]), "ConfigMap")["rel-scalerl-redis"]
    assert f"maxmemory {int(0.6 * 10 * 2**30)}" in sized["data"]["valkey.conf"]


def test_model_cache_and_hf_token():
    docs = render(["--set", "modelCache.enabled=true", "--set", "huggingface.tokenSecretRef.name=hf"])
    validate(docs)
    assert "rel-scalerl-model-cache" in by_kind(docs, "PersistentVolumeClaim")
    deps = by_kind(docs, "Deployment")
    for comp in ["generator", "evaluator", "learner", "weight-broadcast"]:
        spec = deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}, comp
        assert env["HF_HOME"]["value"].startswith("/models/"), comp
        assert {"name": "model-cache", "mountPath": "/models"} in spec["containers"][0]["volumeMounts"], comp
        cache = [v for v in spec["volumes"] if v["name"] == "model-cache"][0]
        assert cache["persistentVolumeClaim"]["claimName"] == "rel-scalerl-model-cache", comp


def test_autoscaler_fallback_and_scale_up_window():
    docs = render(ALL_FEATURES)
    so = [d for d in docs if d["kind"] == "ScaledObject"][0]
    assert so["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 2}
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    # At least one engine warm-up, so generators still loading their model do not cause more scale-ups.
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] >= 600
    hpa = by_kind(render(VARIANTS["hpa"]), "HorizontalPodAutoscaler")["rel-scalerl-generator"]
    assert hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"] >= 600


def test_learner_grace_period_covers_a_checkpoint():
    dep = by_kind(render([]), "Deployment")["rel-scalerl-learner"]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 600
