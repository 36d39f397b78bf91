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

from scalerl.settings import Settings

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


def workloads(docs: list[dict]) -> dict[str, dict]:
    """The services' Deployments and the learner's StatefulSet, by name."""
    return {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}


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
    deps = workloads(docs)
    svcs = by_kind(docs, "Service")
    for comp in ["api", "generator", "evaluator", "reward-grader", "replay-buffer", "learner", "forecaster",
                 "weight-broadcast"]:
        dep = deps[f"rel-scalerl-{comp}"]
        assert f"rel-scalerl-{comp}" in svcs
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["command"][0] == "scalerl-serve" or (comp == "learner" and "exec torchrun" in c["command"][-1])
        assert "grpc" in c["livenessProbe"], comp
        if comp != "api":
            assert "grpc" in c["readinessProbe"], comp
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
        assert not sc["allowPrivilegeEscalation"]
        assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    learner = by_kind(docs, "StatefulSet")["rel-scalerl-learner"]
    assert learner["spec"]["replicas"] == (2 if name == "gpu-cluster" else 1)
    assert learner["spec"]["serviceName"] == "rel-scalerl-learner-headless"
    env = {e["name"]: e for e in deps["rel-scalerl-evaluator"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SCALERL_GENERATOR_ROLE"]["value"] == "evaluator"
    evaluator = deps["rel-scalerl-evaluator"]["spec"]["template"]["spec"]["containers"][0]
    assert evaluator["command"] == ["scalerl-serve", "generator"]


def test_gpu_components_are_scheduled_on_gpu_nodes(manifests):
    name, docs = manifests
    deps = workloads(docs)
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
    sts = {n: d for n, d in by_kind(docs, "StatefulSet").items() if n != "rel-scalerl-learner"}
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
            if "ports" not in rule:  # every port: only torchrun ranks, from each other
                assert np_name == "rel-scalerl-learner", np_name
                assert [p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]] == \
                    ["learner"]
                continue
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
    proc = subprocess.run([tool("helm"), "template", "rel", str(CHART), "--set", "learner.nodes=2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "learner.distributed.enabled" in proc.stderr
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
    deps = workloads(docs)
    for comp in COMPONENTS:
        assert deps[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]["serviceAccountName"] == "ml-runner", comp
    binding = by_kind(docs, "RoleBinding")["rel-scalerl-api"]
    assert binding["subjects"][0]["name"] == "ml-runner"


def test_gpu_pods_have_no_node_selector_by_default():
    deps = workloads(render([]))
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
    deps = workloads(docs)
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
    deps = workloads(docs)
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
    deps = workloads(docs)
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
    dep = by_kind(render([]), "StatefulSet")["rel-scalerl-learner"]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 600


# ------------------------------------------------------------------ GPU use (issue 12 item 4)
DISTRIBUTED = ["--set", "learner.nodes=2", "--set", "learner.gpusPerNode=4", "--set", "learner.distributed.enabled=true",
               "--set-string", "learner.resources.requests.cpu=32"]


def container(docs: list[dict], name: str) -> dict:
    return workloads(docs)[name]["spec"]["template"]["spec"]["containers"][0]


def literal_env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def settings_of(c: dict, monkeypatch) -> Settings:
    """What the service's Settings read from the container's env (the real parser, not a copy of it)."""
    for key in [k for k in os.environ if k.startswith("SCALERL_")]:
        monkeypatch.delenv(key)
    for key, value in literal_env(c).items():
        if key.startswith("SCALERL_") and "$(" not in value:
            monkeypatch.setenv(key, value)
    return Settings()


def test_learner_is_a_statefulset_launched_by_torchrun_across_nodes():
    docs = render(DISTRIBUTED)
    validate(docs)
    sts = by_kind(docs, "StatefulSet")["rel-scalerl-learner"]
    assert "rel-scalerl-learner" not in by_kind(docs, "Deployment")
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = by_kind(docs, "Service")[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    # The gRPC Service reaches rank 0 only: it speaks the job protocol.
    assert by_kind(docs, "Service")["rel-scalerl-learner"]["spec"]["selector"][
        "statefulset.kubernetes.io/pod-name"] == "rel-scalerl-learner-0"
    spec = sts["spec"]["template"]["spec"]
    c = spec["containers"][0]
    command = " ".join(c["command"])
    assert "torchrun --nnodes=2 --nproc-per-node=4" in command
    assert '--node-rank="${POD_NAME##*-}"' in command
    assert "--master-addr=rel-scalerl-learner-0.rel-scalerl-learner-headless.scalerl.svc --master-port=29500" in command
    assert command.endswith("-m scalerl_learner.ranks")
    env = literal_env(c)
    assert env["NCCL_DEBUG"] and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["SCALERL_TORCH_THREADS"] == "8"  # 32 CPUs shared by 4 ranks
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert [v for v in spec["volumes"] if v["name"] == "dshm"][0]["emptyDir"]["medium"] == "Memory"
    # NCCL picks its own ports: ranks reach each other on any port, nobody else does.
    rules = by_kind(docs, "NetworkPolicy")["rel-scalerl-learner"]["spec"]["ingress"]
    peer = [r for r in rules if "ports" not in r]
    assert peer and peer[0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "learner"
    single = container(render([]), "rel-scalerl-learner")
    assert single["command"] == ["scalerl-serve", "learner"]
    assert "ports" in [r for r in by_kind(render([]), "NetworkPolicy")["rel-scalerl-learner"]["spec"]["ingress"]][0]


def test_generator_engine_settings_follow_its_gpus(monkeypatch):
    docs = render(["--set", "generator.gpus=4", "--set-json", "generator.engine.gpuMemoryUtilization=0.8",
                   "--set", "generator.engine.maxNumSeqs=256"])
    validate(docs)
    engine = settings_of(container(docs, "rel-scalerl-generator"), monkeypatch).engine
    assert engine.tensor_parallel_size == 4
    assert engine.gpu_memory_utilization == 0.8 and engine.kv_cache_gib == 0 and engine.max_num_seqs == 256
    assert engine.enforce_eager is False  # CUDA graphs on GPUs
    assert settings_of(container(docs, "rel-scalerl-evaluator"), monkeypatch).engine.tensor_parallel_size == 1


def test_generator_readiness_waits_for_its_engine():
    from scalerl_generator.service import ENGINE_HEALTH_NAME

    docs = render([])
    for comp in ["generator", "evaluator"]:
        c = container(docs, f"rel-scalerl-{comp}")
        assert c["readinessProbe"]["grpc"]["service"] == ENGINE_HEALTH_NAME, comp
        assert "service" not in c["livenessProbe"]["grpc"], comp  # alive while the model loads


@pytest.mark.parametrize("cpu,threads", [("500m", "1"), ("2", "2"), ("7.5", "8"), ("2500m", "3")])
def test_torch_threads_follow_the_cpu_request(cpu, threads, monkeypatch):
    docs = render(["--set-string", f"learner.resources.requests.cpu={cpu}"])
    c = container(docs, "rel-scalerl-learner")
    assert literal_env(c)["SCALERL_TORCH_THREADS"] == threads
    assert settings_of(c, monkeypatch).torch_threads == int(threads)


VLLM_PODS = ("rel-scalerl-generator", "rel-scalerl-evaluator")


def test_numeric_libraries_use_the_threads_of_the_cpu_request(manifests):
    _, docs = manifests
    checked = 0
    for name, w in workloads(docs).items():
        if name.startswith("rel-scalerl-") and name not in ("rel-scalerl-redis", "rel-scalerl-postgres", *VLLM_PODS):
            env = literal_env(w["spec"]["template"]["spec"]["containers"][0])
            assert env["OMP_NUM_THREADS"] == env["SCALERL_TORCH_THREADS"], name
            checked += 1
    assert checked >= 5
    assert literal_env(container(docs, "rel-scalerl-forecaster"))["OMP_NUM_THREADS"] == "1"  # it asks for 250m
    for name in VLLM_PODS:  # vLLM divides the cores among its workers only when OMP_NUM_THREADS is unset
        assert "OMP_NUM_THREADS" not in literal_env(container(docs, name)), name


@pytest.mark.parametrize("field", ["env", "extraEnv"])
def test_a_thread_count_the_user_sets_is_the_only_one(field):
    docs = render(["--set", f"forecaster.{field}[0].name=OMP_NUM_THREADS",
                   "--set-string", f"forecaster.{field}[0].value=4"])
    names = [e["name"] for e in container(docs, "rel-scalerl-forecaster")["env"]]
    assert names.count("OMP_NUM_THREADS") == 1
    assert literal_env(container(docs, "rel-scalerl-forecaster"))["OMP_NUM_THREADS"] == "4"


def test_home_is_writable_on_the_read_only_root(manifests):
    _, docs = manifests
    for name, w in workloads(docs).items():
        if name.startswith("rel-scalerl-") and name not in ("rel-scalerl-redis", "rel-scalerl-postgres"):
            c = w["spec"]["template"]["spec"]["containers"][0]
            assert literal_env(c)["HOME"] == "/tmp", name
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], name


def test_values_no_code_reads_are_gone():
    # recipeDefaults (nothing merged them) and objectStore.uri (nothing read SCALERL_CHECKPOINT_URI) were removed.
    assert "recipeDefaults" in render_fails("--set", "recipeDefaults.model.dtype=bfloat16")
    assert "objectStore" in render_fails("--set", "objectStore.uri=s3://b/ckpt")
    docs = render([])
    assert not [d for d in docs if d["kind"] == "ConfigMap" and "recipe-defaults" in d["metadata"]["name"]]
    for name, w in workloads(docs).items():
        env = {e["name"] for c in w["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
        assert not env & {"SCALERL_CHECKPOINT_URI", "SCALERL_RECIPE_DEFAULTS"}, name


def test_filesystem_weight_transport_volume(monkeypatch):
    docs = render(["--set", "weightTransport.type=filesystem", "--set", "weightTransport.filesystem.keepVersions=6"])
    validate(docs)
    pvc = by_kind(docs, "PersistentVolumeClaim")["rel-scalerl-weights"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for comp in ["learner", "generator", "evaluator"]:
        w = workloads(docs)[f"rel-scalerl-{comp}"]["spec"]["template"]["spec"]
        c = w["containers"][0]
        assert {"name": "weights", "mountPath": "/weights"} in c["volumeMounts"], comp
        assert {"name": "weights", "persistentVolumeClaim": {"claimName": "rel-scalerl-weights"}} in w["volumes"]
        transport = settings_of(c, monkeypatch).weight_transport
        assert (transport.type, transport.root, transport.keep_versions) == ("filesystem", "/weights", 6), comp
    for comp in ["api", "replay-buffer", "reward-grader", "forecaster"]:
        c = container(docs, f"rel-scalerl-{comp}")
        assert "SCALERL_WEIGHT_TRANSPORT__TYPE" not in literal_env(c), comp
    assert "rel-scalerl-weights" not in by_kind(render([]), "PersistentVolumeClaim")


def test_every_pvc_but_the_weight_scratch_outlives_an_uninstall():
    docs = render(["--set", "weightTransport.type=filesystem", "--set", "modelCache.enabled=true"])
    pvcs = by_kind(docs, "PersistentVolumeClaim")
    assert {"rel-scalerl-weights", "rel-scalerl-model-cache", "rel-scalerl-forecaster"} <= set(pvcs)
    kept = {name for name, pvc in pvcs.items()
            if pvc["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep"}
    assert set(pvcs) - kept == {"rel-scalerl-weights"}


# ------------------------------------------------------------------ weight relay (issue 17)
def test_generators_relay_weights_at_their_pod_ip(monkeypatch):
    docs = render([])
    validate(docs)
    for name in ("rel-scalerl-generator",):
        c = container(docs, name)
        transport = settings_of(c, monkeypatch).weight_transport
        assert transport.type == "grpc" and transport.relay and transport.relay_port == 18057, name
        host = next(e for e in c["env"] if e["name"] == "SCALERL_WEIGHT_TRANSPORT__RELAY_HOST")
        assert host["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert {"name": "relay", "containerPort": 18057, "protocol": "TCP"} in c["ports"]
        policy = by_kind(docs, "NetworkPolicy")[name]
        assert any({p["port"] for p in rule.get("ports", [])} == {"relay"} for rule in policy["spec"]["ingress"])
    assert "relay" not in {p["name"] for p in container(docs, "rel-scalerl-learner")["ports"]}
    # the evaluator fetches the versions it validates and relays nothing: a relay port there was its own gRPC port
    evaluator = container(docs, "rel-scalerl-evaluator")
    assert not settings_of(evaluator, monkeypatch).weight_transport.relay_port
    assert [p["containerPort"] for p in evaluator["ports"]] == [18057, 9107]
    assert not any({p["port"] for p in rule.get("ports", [])} == {"relay"}
                   for rule in by_kind(docs, "NetworkPolicy")["rel-scalerl-evaluator"]["spec"]["ingress"])


def test_the_hub_serves_the_tcp_data_plane_on_its_service(monkeypatch):
    docs = render([])
    validate(docs)
    hub = container(docs, "rel-scalerl-weight-broadcast")
    assert {"name": "data", "containerPort": 18058, "protocol": "TCP"} in hub["ports"]
    assert settings_of(hub, monkeypatch).weight_transport.data_port == 18058
    assert settings_of(hub, monkeypatch).weight_transport.hub_keep_versions == 2
    service = by_kind(docs, "Service")["rel-scalerl-weight-broadcast"]
    assert {"name": "data", "port": 18058, "targetPort": "data", "protocol": "TCP"} in service["spec"]["ports"]
    policy = by_kind(docs, "NetworkPolicy")["rel-scalerl-weight-broadcast"]
    assert any({p["port"] for p in rule.get("ports", [])} == {"data"} for rule in policy["spec"]["ingress"])
    for name in ("rel-scalerl-learner", "rel-scalerl-generator", "rel-scalerl-evaluator"):
        assert settings_of(container(docs, name), monkeypatch).weight_transport.data_plane == "tcp", name
    grpc_plane = render(["--set", "weightTransport.grpc.dataPlane=grpc"])
    assert settings_of(container(grpc_plane, "rel-scalerl-generator"), monkeypatch).weight_transport.data_plane \
        == "grpc"
    assert "dataPlane" in render_fails("--set", "weightTransport.grpc.dataPlane=pigeon")


def test_the_learner_publishes_deltas_as_weight_transport_grpc_delta_says(monkeypatch):
    learner = container(render([]), "rel-scalerl-learner")
    assert settings_of(learner, monkeypatch).weight_transport.delta == "auto"
    for value, expected in (("false", False), ("true", True)):
        docs = render(["--set", f"weightTransport.grpc.delta={value}"])
        assert settings_of(container(docs, "rel-scalerl-learner"), monkeypatch).weight_transport.delta is expected
    assert "SCALERL_WEIGHT_TRANSPORT__DELTA" not in literal_env(container(render([]), "rel-scalerl-generator"))
    assert "delta" in render_fails("--set", "weightTransport.grpc.delta=sometimes")


def test_relay_off_and_filesystem_transport_open_no_relay_port(monkeypatch):
    off = container(render(["--set", "weightTransport.grpc.relay=false"]), "rel-scalerl-generator")
    assert settings_of(off, monkeypatch).weight_transport.relay is False
    assert "relay" not in {p["name"] for p in off["ports"]}
    fs = container(render(["--set", "weightTransport.type=filesystem"]), "rel-scalerl-generator")
    assert "relay" not in {p["name"] for p in fs["ports"]}
    assert settings_of(fs, monkeypatch).weight_transport.type == "filesystem"


# ------------------------------------------------------------------ file-task datasets (issue 13)
def test_dataset_claim_is_mounted_read_only_where_datasets_are_read():
    docs = render(["--set", "datasets.existingClaim=team-data"])
    validate(docs)
    for name, pod in pod_specs(docs).items():
        mounts = {m["name"]: m for m in pod["containers"][0].get("volumeMounts", [])}
        readers = {"rel-scalerl-api", "rel-scalerl-replay-buffer", "rel-scalerl-generator", "rel-scalerl-evaluator"}
        if name in readers:
            assert mounts["datasets"] == {"name": "datasets", "mountPath": "/datasets", "readOnly": True}, name
            volume = next(v for v in pod["volumes"] if v["name"] == "datasets")
            assert volume["persistentVolumeClaim"] == {"claimName": "team-data", "readOnly": True}
        else:
            assert "datasets" not in mounts, name
    assert not any("datasets" in {m["name"] for m in p["containers"][0].get("volumeMounts", [])}
                   for p in pod_specs(render([])).values())
