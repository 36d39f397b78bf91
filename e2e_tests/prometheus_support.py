"""A real Prometheus (Debian's `prometheus`, installed by scripts/install_k8s_tools.sh) scraping the local stack.

The scrape config is generated from the chart's own ServiceMonitor (`helm template` with the monitor on): the
components it selects, its endpoint's path, interval, timeout and honorLabels, its jobLabel (job = component) and
its relabelings (pod, component), plus the labels the Prometheus operator adds (namespace, service). A change to
the chart's monitor changes what this Prometheus scrapes.

    python e2e_tests/prometheus_support.py stack.json   # print the scrape config for a running `scalerl up`
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "scalerl"
ALERTS = CHART / "files" / "alerts.rules.yaml"
NAMESPACE = "scalerl"
CRD_API = "monitoring.coreos.com/v1/ServiceMonitor"


def tool(name: str) -> str:
    local = ROOT / "tools" / "bin" / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found (tools/bin, PATH): run `make k8s-tools`")
    return found


def chart_service_monitor(interval: str = "1s", timeout: str = "1s") -> dict:
    """The chart's ServiceMonitor spec, rendered with a test scrape interval."""
    out = subprocess.run(
        [tool("helm"), "template", "rel", str(CHART), "--namespace", NAMESPACE, "--api-versions", CRD_API,
         "--set", "metrics.serviceMonitor.enabled=true", "--set", f"metrics.serviceMonitor.interval={interval}",
         "--set", f"metrics.serviceMonitor.scrapeTimeout={timeout}"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    monitors = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ServiceMonitor"]
    assert len(monitors) == 1, monitors
    return monitors[0]["spec"]


def component_of(proc_name: str) -> str:
    """Stack process name -> the chart component (app.kubernetes.io/component) that runs it."""
    if proc_name.startswith("generator-"):
        return "generator"
    if proc_name.startswith("replay-buffer"):
        return "replay-buffer"
    return proc_name


def scrape_config(monitor: dict, targets: dict[str, int], evaluation_interval: str = "1s") -> dict:
    """Prometheus config scraping `targets` ({process name: metrics port} on 127.0.0.1) as the monitor would."""
    selected = {v for e in monitor["selector"].get("matchExpressions", [])
                if e["key"] == "app.kubernetes.io/component" and e["operator"] == "In" for v in e["values"]}
    assert monitor["jobLabel"] == "app.kubernetes.io/component", monitor["jobLabel"]
    endpoint, = monitor["endpoints"]
    relabeled = {r["targetLabel"]: r["sourceLabels"][0] for r in endpoint.get("relabelings", [])}
    pod_meta = {"__meta_kubernetes_pod_name": lambda name, comp: name,
                "__meta_kubernetes_pod_label_app_kubernetes_io_component": lambda name, comp: comp}
    jobs: dict[str, list] = {}
    for name, port in sorted(targets.items()):
        comp = component_of(name)
        if comp not in selected:
            continue
        labels = {"namespace": NAMESPACE, "service": f"rel-scalerl-{comp}", "pod": name}
        labels |= {target: pod_meta[source](name, comp) for target, source in relabeled.items()}
        jobs.setdefault(comp, []).append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
    return {
        "global": {"scrape_interval": endpoint["interval"], "scrape_timeout": endpoint["scrapeTimeout"],
                   "evaluation_interval": evaluation_interval},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": comp, "metrics_path": endpoint["path"], "honor_labels": endpoint.get("honorLabels", False),
             "scrape_interval": endpoint["interval"], "scrape_timeout": endpoint["scrapeTimeout"],
             "static_configs": static}
            for comp, static in sorted(jobs.items())
        ],
    }


class Prometheus:
    def __init__(self, url: str):
        self.client = httpx.Client(base_url=url, timeout=30)

    def query(self, expr: str) -> list[dict]:
        reply = self.client.get("/api/v1/query", params={"query": expr})
        body = reply.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def targets_up(self) -> dict[str, str]:
        active = self.client.get("/api/v1/targets").json()["data"]["activeTargets"]
        return {t["labels"]["pod"]: t["health"] for t in active}

    def rules(self) -> list[dict]:
        return [r for g in self.client.get("/api/v1/rules").json()["data"]["groups"] for r in g["rules"]]


@contextlib.contextmanager
def running_prometheus(config: dict, workdir: Path, port: int):
    """Debian's prometheus with `config` on 127.0.0.1:port until the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    subprocess.run([tool("promtool"), "check", "config", str(config_path)], check=True, capture_output=True,
                   timeout=60)
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen([tool("prometheus"), f"--config.file={config_path}",
                             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--storage.tsdb.retention.time=1d", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


if __name__ == "__main__":
    state = json.loads(Path(sys.argv[1]).read_text())
    ports = {s["name"]: int(s["metrics"].rsplit(":", 1)[1].split("/")[0]) for s in state["services"]}
    print(yaml.safe_dump(scrape_config(chart_service_monitor("15s", "10s"), ports)))
