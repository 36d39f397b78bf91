"""A real Prometheus scrapes the e2e stack the way the chart's ServiceMonitor would (prometheus_support), with the
chart's alert rules loaded, while a short job runs and after it ends:

* every dashboard panel query returns series while the job runs;
* the buffer totals Prometheus sums over two replay-buffer replicas equal the truth read from Redis (GetStats
  before and after the scrape bound them; one series each, not one per replica);
* after the job: no series of the families the alerts read carries the job, no alert fires, and every alert
  expression, with its range windows moved past the job's end, returns nothing for it.
"""

from __future__ import annotations

import json
import re
import time

import grpc
import pytest

from e2e_support import tiny_recipe, wait_for
from prometheus_support import ALERTS, ROOT, chart_service_monitor, running_prometheus, scrape_config
from scalerl.ports import unused_port
from scalerl.serving import channel, check_health
from scalerl.v1 import replay_buffer_pb2, replay_buffer_pb2_grpc
from scalerl_stack.supervisor import ServiceProc

pytestmark = pytest.mark.e2e

DASHBOARDS = ROOT / "helm" / "scalerl" / "dashboards"
RECIPE = tiny_recipe(
    # thinking budgets of 1-2 tokens: the tiny model has not stopped yet, so completions are interrupted and the
    # interruption panel has data
    generation={"forced_interruption": True, "thinking_budget_low": 1, "thinking_budget_high": 2,
                "interruption_phrase": " Answer:"},
    # validation points at steps 0, 3, ..., 36: the forecaster fits (6 points past 0) well before the job ends
    validation={"every_steps": 3,
                "eval_sets": [{"task": "arithmetic", "name": "arith-sample", "num_prompts": 4,
                               "samples_per_prompt": 1}]},
    # a compute budget far above what the job spends (it ends by max_steps) and a target: budget/target panels
    budget={"max_steps": 36, "checkpoint_every_steps": 12, "compute_device_hours": 1000.0, "target_pass_rate": 0.9},
)
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval for a 1 s scrape interval, with room for a slow scrape
ENDED = ("succeeded", "failed", "cancelled")
METRIC_RE = re.compile(r"\bscalerl_[a-z0-9_]+")


def panel_queries(job_id: str) -> dict[str, str]:
    """Every dashboard target, its Grafana variables filled in: {"<dashboard>/<panel>/<refId>": PromQL}."""
    out = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for t in panel.get("targets", []):
                if t.get("expr"):
                    # the comparison panel compares the job with itself here
                    expr = (t["expr"].replace("$namespace", ".*").replace("$job", job_id).replace("$eval_set", ".*")
                            .replace("$compare", job_id).replace("$__range", "1h")
                            .replace("$__rate_interval", RATE_INTERVAL))
                    out[f"{path.stem}/{panel['title']}/{t['refId']}"] = expr
    return out


def live_fit_panel() -> dict:
    board = json.loads((DASHBOARDS / "scalerl-forecast.json").read_text())
    return next(p for p in board["panels"] if p["title"].startswith("Validation curve"))


def live_fit_fields(prom, panel: dict, job_id: str) -> dict[str, dict[str, float]]:
    """The panel's one frame as Grafana builds it from the instant tables: field name -> {point: value}
    (the outer join on `point`; each table's value column renamed by the panel's organize step)."""
    renames = next(t for t in panel["transformations"] if t["id"] == "organize")["options"]["renameByName"]
    fields: dict[str, dict[str, float]] = {}
    for t in panel["targets"]:
        assert t.get("instant") and t.get("format") == "table", t  # indexed gauges: no time range involved
        name = renames[f"Value #{t['refId']}"]
        expr = t["expr"].replace("$namespace", ".*").replace("$job", job_id)
        fields[name] = {r["metric"]["point"]: float(r["value"][1]) for r in prom.query(expr)}
    return fields


def live_fit_draws(prom, job_id: str, points: int) -> str:
    """"" when every series the live-fit panel names has its x and y fields in the frame with values on common
    rows, and the measured series holds every validation point; else what is missing."""
    panel = live_fit_panel()
    fields = live_fit_fields(prom, panel, job_id)
    for series in panel["options"]["series"]:
        assert series["frame"]["matcher"] == {"id": "byIndex", "options": 0}  # the join makes one frame
        x, y = series["x"]["matcher"]["options"], series["y"]["matcher"]["options"]
        assert x in fields and y in fields, (series, sorted(fields))
        if not set(fields[x]) & set(fields[y]):
            return f"series {series['name']['fixed']}: no row with both {x!r} and {y!r} ({ {k: len(v) for k, v in fields.items()} })"
    # every measured point up to the last scrape (the REST count may be one ahead of it)
    measured = fields[panel["options"]["series"][-1]["y"]["matcher"]["options"]]
    return "" if points - 1 <= len(measured) <= points else f"{len(measured)} measured points, the job has {points}"


def alert_rules() -> list[dict]:
    import yaml

    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def buffer_stats(addr: str, job_id: str) -> replay_buffer_pb2.BufferStats:
    with channel(addr) as ch:
        return replay_buffer_pb2_grpc.ReplayBufferStub(ch).GetStats(
            replay_buffer_pb2.GetStatsRequest(job_id=job_id), timeout=10)


def check_buffer_totals(prom, addr: str, job_id: str) -> bool:
    """Prometheus' sum() over both replicas lies between the Redis truth read before and after a fresh scrape."""
    try:
        before = buffer_stats(addr, job_id)
    except grpc.RpcError as err:  # the job's buffer is not initialised yet
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    if before.groups_written == 0:
        return False
    time.sleep(2.5)  # at least two 1 s scrapes after `before`
    values = {}
    for field, metric in [("groups_written", "scalerl_buffer_groups_written_total"),
                          ("groups_trained", "scalerl_buffer_groups_trained_total")]:
        series = prom.query(f'{metric}{{job_id="{job_id}"}}')
        assert len(series) == 1, f"{metric}: {len(series)} series for one job (one per replica doubles sum())"
        values[field] = float(prom.query(f'sum({metric}{{job_id="{job_id}"}})')[0]["value"][1])
    after = buffer_stats(addr, job_id)
    for field, value in values.items():
        assert getattr(before, field) <= value <= getattr(after, field), (field, getattr(before, field), value,
                                                                           getattr(after, field))
    return True


def test_prometheus_scrapes_the_stack_as_the_chart_does(stack, api, tmp_path):
    s, _ = stack
    buffer = next(p for p in s.procs if p.name == "replay-buffer")
    # A second replay-buffer replica, as the chart runs two: both read the same Redis.
    grpc_port, metrics_port = unused_port(), unused_port()
    extra = ServiceProc("replay-buffer-1", "replay-buffer", grpc_port, metrics_port,
                        buffer.env | {"SCALERL_GRPC_PORT": str(grpc_port), "SCALERL_METRICS_PORT": str(metrics_port)},
                        tmp_path / "replay-buffer-1.log")
    extra.start()
    try:
        wait_for(lambda: check_health(extra.addr) == "SERVING", 120, what="second replay-buffer replica")
        targets = {p.name: p.metrics_port for p in s.procs} | {extra.name: extra.metrics_port}
        config = scrape_config(chart_service_monitor(), targets)
        assert {c["job_name"] for c in config["scrape_configs"]} == {
            "api", "generator", "evaluator", "reward-grader", "replay-buffer", "learner", "forecaster",
            "weight-broadcast"}
        with running_prometheus(config, tmp_path / "prometheus", unused_port()) as prom:
            wait_for(lambda: set(prom.targets_up().values()) == {"up"} and len(prom.targets_up()) == len(targets),
                     60, what=f"every target up: {targets}")
            reply = api.post("/v1/jobs", json={"recipe": RECIPE, "name": "e2e-prometheus"})
            assert reply.status_code in (200, 201), reply.text
            job_id = reply.json()["id"]

            queries = panel_queries(job_id)
            returned: set[str] = set()
            buffer_checks = 0
            points = 0.0
            live_fit = "not checked"
            while api.get(f"/v1/jobs/{job_id}").json()["state"] not in ENDED:
                if live_fit:
                    measured = len(api.get(f"/v1/jobs/{job_id}/curve").json()["points"])
                    if measured >= 7:
                        live_fit = live_fit_draws(prom, job_id, measured)
                seen = prom.query(f'max(scalerl_forecaster_points{{job_id="{job_id}"}})')
                points = max([points] + [float(r["value"][1]) for r in seen])
                for key, expr in queries.items():
                    if key not in returned and prom.query(expr):
                        returned.add(key)
                if buffer_checks < 3 and check_buffer_totals(prom, buffer.addr, job_id):
                    buffer_checks += 1
                time.sleep(1)
            final = api.get(f"/v1/jobs/{job_id}").json()
            assert final["state"] == "succeeded", final
            missing = {k: queries[k] for k in sorted(set(queries) - returned)}
            assert not missing, (f"panel queries that never returned series while the job ran "
                                 f"(validation points seen: {points:.0f}): {missing}")
            assert buffer_checks >= 1, "the buffer totals were never compared while the job ran"
            assert not live_fit, f"the live-fit panel never had every series it draws while the job ran: {live_fit}"

            # After the job: the families the alerts read no longer carry it ...
            alert_families = sorted({m for r in alert_rules() for m in METRIC_RE.findall(r["expr"])})
            selector = "|".join(alert_families)

            def still_exported() -> list:
                return prom.query(f'count by (__name__) ({{__name__=~"{selector}", job_id="{job_id}"}})')

            wait_for(lambda: not still_exported(), 60, what=f"the ended job's series to go: {still_exported()}")
            time.sleep(6)  # a 5 s window entirely after the removal, and several rule evaluations
            # ... no alert fires or is pending for it ...
            assert prom.query(f'ALERTS{{job_id="{job_id}"}}') == []
            # ... and every alert expression, its windows past the job's end, is empty for it.
            for rule in alert_rules():
                expr = re.sub(r"\[\d+[smhd]\]", "[5s]", rule["expr"])
                hits = [r for r in prom.query(expr) if r["metric"].get("job_id") == job_id]
                assert not hits, (rule["alert"], hits)
    finally:
        extra.proc.terminate()
        extra.proc.wait(30)
