#!/usr/bin/env python
"""Generate the ScaleRL Grafana dashboards as code (grafana-foundation-sdk).

    python scripts/gen_dashboards.py           # write helm/scalerl/dashboards/*.json
    python scripts/gen_dashboards.py --check   # exit 1 if the committed JSON is stale

The chart ships every helm/scalerl/dashboards/*.json as a ConfigMap labelled grafana_dashboard: "1".
Every metric used here must be listed in helm/tests/exported_metrics.txt (checked by helm/tests).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries, xychart
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import xychart as xm

GRAFANA_VERSION = "11.6.0"
"""The Grafana version the dashboards are written for (the SDK's models of that version; panels carry it as
pluginVersion, so Grafana does not run its migrations on them)."""
OUT = Path(__file__).resolve().parent.parent / "helm" / "scalerl" / "dashboards"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace=~"$namespace", job_id=~"$job"'
BUDGET_ROLES = 'role!="evaluator"'
"""The compute budget counts the learner and the rollout generators, as the job's total does (not the evaluator)."""


def q(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> prometheus.Dataquery:
    b = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        b = b.legend_format(legend)
    if instant:
        b = b.instant()
    if table:
        b = b.format(pm.PromQueryFormat.TABLE)
    return b


def ts(title: str, unit: str, *queries: prometheus.Dataquery, desc: str = "", w: int = 12, h: int = 8) -> timeseries.Panel:
    p = (
        timeseries.Panel().title(title).datasource(DS).unit(unit).height(h).span(w)
        .line_width(1).fill_opacity(10).show_points(cm.VisibilityMode.NEVER)
        .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE).placement(cm.LegendPlacement.BOTTOM)
                .show_legend(True).calcs(["lastNotNull", "max"]))
    )
    if desc:
        p = p.description(desc)
    for query in queries:
        p = p.with_target(query)
    return p


def st(title: str, unit: str, query: prometheus.Dataquery, desc: str = "", w: int = 4, h: int = 4) -> stat.Panel:
    p = stat.Panel().title(title).datasource(DS).unit(unit).height(h).span(w).with_target(query)
    return p.description(desc) if desc else p


def variables(d: db.Dashboard) -> db.Dashboard:
    return (
        d.with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            db.QueryVariable("namespace").label("Namespace").datasource(DS)
            .query("label_values(scalerl_learner_step, namespace)").refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True).all_value(".*").multi(True)
        )
        .with_variable(
            db.QueryVariable("job").label("Job").datasource(DS)
            .query('label_values(scalerl_learner_step{namespace=~"$namespace"}, job_id)')
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
    )


CURVE_FIELDS = {"A": "compute (device-h)", "B": "fit", "C": "lower", "D": "upper",
                "E": "validation compute (device-h)", "F": "validation pass rate"}
"""The live-fit panel's fields, by the refId of the query that produces each."""
LIVE_FIT_TITLE = "Validation curve: fit, band and measured points"
COMPARE_TITLE = "Two jobs: fits and measured points ($job vs $compare)"


def xy_panel(title: str, description: str, exprs: dict[str, str], fields: dict[str, str],
             series: list[tuple[str, str, str]], styles: list[tuple[str, xm.XYShowMode, int, bool]],
             sort_by: str) -> xychart.Panel:
    """An XY chart in Grafana 11's schema over instant tables of gauges indexed by `point`: one outer join on
    `point` makes one frame, each table's value column ("Value #<refId>") is renamed to its field name, every
    series names frame 0 and its x and y fields by name, and the styles are field overrides."""
    join = dm.DataTransformerConfig(id_val="joinByField", options={"byField": "point", "mode": "outer"})
    rename = dm.DataTransformerConfig(
        id_val="organize", options={"renameByName": {f"Value #{ref}": name for ref, name in fields.items()},
                                    "excludeByName": {"Time": True}})
    sort = dm.DataTransformerConfig(id_val="sortBy", options={"sort": [{"field": sort_by}]})

    def matcher(id_val: str, options) -> xychart.MatcherConfig:
        return xychart.MatcherConfig().id(id_val).options(options)

    p = (
        xychart.Panel().title(title).datasource(DS).height(12).span(16).description(description)
        .unit("percentunit").min(0).max(1)
        .mapping(xm.SeriesMapping.MANUAL)
        .series([xychart.XYSeriesConfig().name(xychart.XychartXYSeriesConfigName().fixed(name))
                 .frame(xychart.XychartXYSeriesConfigFrame().matcher(matcher("byIndex", 0)))
                 .x(xychart.XychartXYSeriesConfigX().matcher(matcher("byName", x)))
                 .y(xychart.XychartXYSeriesConfigY().matcher(matcher("byName", y))) for name, x, y in series])
        .with_transformation(join).with_transformation(rename).with_transformation(sort)
        .legend(cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM))
    )
    for field, show, size, dash in styles:
        props = [dm.DynamicConfigValue(id_val="custom.show", value=show),
                 dm.DynamicConfigValue(id_val="custom.pointSize", value={"fixed": size})]
        if dash:
            props.append(dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [8, 4]}))
        p = p.with_override(dm.MatcherConfig(id_val="byName", options=field), props)
    for ref, expr in exprs.items():
        p = p.with_target(q(expr, ref=ref, instant=True, table=True))
    return p


def curve_panel() -> xychart.Panel:
    """Validation pass rate vs compute: the fitted sigmoid, its band out to the budget, and the measured points.
    Indexed gauges (`point` = 0, 1, ...), so the panel draws the whole job whatever the dashboard's time range."""
    curve = f'{{{SEL}}}'
    exprs = {
        "A": f"max by (point) (scalerl_forecaster_curve_compute_device_hours{curve})",
        "B": f'max by (point) (scalerl_forecaster_curve_pass_rate{{{SEL}, kind="fit"}})',
        "C": f'max by (point) (scalerl_forecaster_curve_pass_rate{{{SEL}, kind="lower"}})',
        "D": f'max by (point) (scalerl_forecaster_curve_pass_rate{{{SEL}, kind="upper"}})',
        "E": f"max by (point) (scalerl_forecaster_point_compute_device_hours{curve})",
        "F": f"max by (point) (scalerl_forecaster_point_pass_rate{curve})",
    }
    f = CURVE_FIELDS
    return xy_panel(
        LIVE_FIT_TITLE,
        "Sigmoid fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) with its interval band, sampled from 0 to the job's "
        "compute budget (scalerl_forecaster_curve_*), and the measured validation points (scalerl_forecaster_point_*; "
        "past 256 points, 256 of them evenly spread). "
        "Past the last point the band widens faster: it also carries the model discrepancy "
        "(recipe forecast.model_discrepancy).",
        exprs, f, [("fit", f["A"], f["B"]), ("lower", f["A"], f["C"]), ("upper", f["A"], f["D"]),
                   ("validation", f["E"], f["F"])],
        [(f["B"], xm.XYShowMode.LINES, 3, False), (f["C"], xm.XYShowMode.LINES, 2, True),
         (f["D"], xm.XYShowMode.LINES, 2, True), (f["F"], xm.XYShowMode.POINTS, 7, False)], sort_by=f["A"])


def compare_panel() -> xychart.Panel:
    """Two jobs on one compute axis: each one's fit and measured points. The forecaster exports only the active
    job, so each series is its last value within the dashboard's time range (a finished job shows when the range
    covers its run); the verdict with intervals is `scalerl compare` / GET /v1/compare."""
    def last(metric: str, job: str, extra: str = "") -> str:
        return (f'max by (point) (last_over_time({metric}{{namespace=~"$namespace", job_id=~"{job}"{extra}}}'
                f"[$__range]))")

    exprs, fields, series, styles = {}, {}, [], []
    for refs, job, label in (("ABCD", "$job", "$job"), ("EFGH", "$compare", "$compare")):
        c, fit, pc, pv = refs
        exprs |= {c: last("scalerl_forecaster_curve_compute_device_hours", job),
                  fit: last("scalerl_forecaster_curve_pass_rate", job, ', kind="fit"'),
                  pc: last("scalerl_forecaster_point_compute_device_hours", job),
                  pv: last("scalerl_forecaster_point_pass_rate", job)}
        fields |= {c: f"{label} compute (device-h)", fit: f"{label} fit",
                   pc: f"{label} validation compute (device-h)", pv: f"{label} validation pass rate"}
        series += [(f"{label} fit", fields[c], fields[fit]), (f"{label} validation", fields[pc], fields[pv])]
        styles += [(fields[fit], xm.XYShowMode.LINES, 3, job == "$compare"), (fields[pv], xm.XYShowMode.POINTS, 7, False)]
    return xy_panel(COMPARE_TITLE, compare_panel.__doc__.replace("\n    ", " "), exprs, fields, series, styles,
                    sort_by=fields["A"])


def forecast_dashboard() -> dm.Dashboard:
    d = (
        db.Dashboard("ScaleRL / Forecast").uid("scalerl-forecast").tags(["scalerl"]).refresh("30s")
        .time("now-24h", "now").timezone("browser").editable().tooltip(dm.DashboardCursorSync.CROSSHAIR)
    )
    d = variables(d).with_variable(
        db.QueryVariable("compare").label("Compare with").datasource(DS)
        .query('label_values(scalerl_forecaster_points{namespace=~"$namespace"}, job_id)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
    ).with_variable(
        db.QueryVariable("eval_set").label("Eval set").datasource(DS)
        .query('label_values(scalerl_forecaster_eval_set_pass_rate{job_id=~"$job"}, eval_set)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True).all_value(".*").multi(True))
    d = d.with_row(db.Row("Forecast"))
    d = d.with_panel(curve_panel())
    d = d.with_panel(st("Predicted pass rate at budget", "percentunit",
                        q(f"max(scalerl_forecaster_predicted_pass_rate{{{SEL}}})"), w=4, h=6))
    d = d.with_panel(st("Compute to target", "h",
                        q(f"max(scalerl_forecaster_compute_to_target_device_hours{{{SEL}}})"),
                        desc="Device-hours to reach the job's target pass rate; -1 = unreachable with this fit.", w=4, h=6))
    d = d.with_panel(st("Target pass rate", "percentunit", q(f"max(scalerl_forecaster_target_pass_rate{{{SEL}}})"), w=4, h=6))
    d = d.with_panel(st("Fit identifiable", "none", q(f"max(scalerl_forecaster_identifiable{{{SEL}}})"), w=2, h=6))
    d = d.with_panel(st("Validation points", "none", q(f"max(scalerl_forecaster_points{{{SEL}}})"), w=2, h=6))
    d = d.with_row(db.Row("Compare two jobs"))
    d = d.with_panel(compare_panel())
    d = d.with_row(db.Row("Scale or stop"))
    d = d.with_panel(
        st("Recommendation", "none",
           q(f"max by (recommendation) (scalerl_forecaster_recommendation{{{SEL}}}) == 1", legend="{{recommendation}}"),
           desc="continue, stop (the ceiling is reached within noise) or not decidable yet (GET /v1/jobs/{id}/decision, "
                "`scalerl status`).", w=6, h=6).text_mode(cm.BigValueTextMode.NAME))
    d = d.with_panel(st("Predicted pass rate at more compute", "percentunit",
                        q(f'max by (factor) (scalerl_forecaster_advice_pass_rate{{{SEL}, kind="fit"}})',
                          legend="{{factor}} the compute spent"),
                        desc="The fit's prediction at 2x, 4x and 10x the compute spent so far.", w=12, h=6))
    d = d.with_panel(st("Compute until decidable", "h",
                        q(f"max(scalerl_forecaster_compute_to_identify_device_hours{{{SEL}}})"),
                        desc="Device-hours at which the fit should become identifiable; -1: decidable now.", w=6, h=6))
    d = d.with_row(db.Row("Downstream eval sets"))
    d = d.with_panel(ts("Eval-set pass rate", "percentunit",
                        q(f'max by (eval_set) (scalerl_forecaster_eval_set_pass_rate{{{SEL}, eval_set=~"$eval_set"}})',
                          legend="{{eval_set}}"),
                        desc="Latest pass rate of each downstream set (recipe validation.eval_sets); its curve, fit and "
                             "correlation with iid: GET /v1/jobs/{id}/curve?eval_set=NAME, /v1/jobs/{id}/correlations.",
                        w=16))
    d = d.with_panel(st("Eval-set ceiling A", "percentunit",
                        q(f'max by (eval_set) (scalerl_forecaster_eval_set_fit_param{{{SEL}, eval_set=~"$eval_set", '
                          f'param="A"}})', legend="{{eval_set}}"), w=8, h=8))
    d = d.with_row(db.Row("Fit parameters with intervals"))
    for param, unit, desc in [
        ("A", "percentunit", "Asymptotic pass rate (the ceiling)."),
        ("B", "none", "Scaling exponent (compute efficiency)."),
        ("C_mid", "h", "Compute (device-hours) at half of the gain."),
    ]:
        d = d.with_panel(ts(
            f"{param} (fit and interval)", unit,
            q(f'max(scalerl_forecaster_fit_param{{{SEL}, param="{param}"}})', legend=param, ref="A"),
            q(f'max(scalerl_forecaster_fit_param_lower{{{SEL}, param="{param}"}})', legend="lower", ref="B"),
            q(f'max(scalerl_forecaster_fit_param_upper{{{SEL}, param="{param}"}})', legend="upper", ref="C"),
            desc=desc, w=8,
        ))
    d = d.with_row(db.Row("Compute"))
    d = d.with_panel(ts(
        "Compute spent vs budget", "h",
        q(f"sum by (role) (scalerl_learner_compute_device_hours{{{SEL}}})", legend="{{role}}", ref="A"),
        q(f'sum(scalerl_learner_compute_device_hours{{{SEL}, {BUDGET_ROLES}}})', legend="total (learner + generators)",
          ref="B"),
        q(f"max(scalerl_learner_compute_budget_device_hours{{{SEL}}})", legend="budget", ref="C"),
        w=16,
    ))
    d = d.with_panel(st(
        "Budget spent", "percentunit",
        q(f'sum(scalerl_learner_compute_device_hours{{{SEL}, {BUDGET_ROLES}}})'
          f" / max(scalerl_learner_compute_budget_device_hours{{{SEL}}})"),
        desc="Learner and rollout-generator device-hours over the budget; the evaluator does not count.",
        w=8, h=8,
    ))
    return d.build()


def pipeline_dashboard() -> dm.Dashboard:
    d = (
        db.Dashboard("ScaleRL / Pipeline").uid("scalerl-pipeline").tags(["scalerl"]).refresh("30s")
        .time("now-6h", "now").timezone("browser").editable().tooltip(dm.DashboardCursorSync.CROSSHAIR)
    )
    d = variables(d)
    d = d.with_row(db.Row("Generators"))
    d = d.with_panel(ts(
        "Generator tokens/s", "short",
        q(f"sum(rate(scalerl_generator_tokens_generated_total{{{SEL}}}[$__rate_interval]))", legend="total", ref="A"),
        q(f"sum by (generator_id) (rate(scalerl_generator_tokens_generated_total{{{SEL}}}[$__rate_interval]))",
          legend="{{generator_id}}", ref="B"),
    ))
    d = d.with_panel(ts(
        "Generator replicas and groups in flight", "short",
        q(f"count(scalerl_generator_groups_in_flight{{{SEL}}})", legend="replicas", ref="A"),
        q(f"sum(scalerl_generator_groups_in_flight{{{SEL}}})", legend="groups in flight", ref="B"),
    ))
    d = d.with_panel(ts(
        "Generator idle fraction", "percentunit",
        q(f"sum by (generator_id) (rate(scalerl_generator_idle_seconds_total{{{SEL}}}[$__rate_interval]))",
          legend="{{generator_id}}", ref="A"),
        desc="Time waiting on buffer backpressure or for prompts.", w=8,
    ))
    d = d.with_panel(ts(
        "Weight-version lag", "short",
        q(f"max(scalerl_generator_weight_version_lag{{{SEL}}})", legend="max", ref="A"),
        q(f"avg(scalerl_generator_weight_version_lag{{{SEL}}})", legend="mean", ref="B"),
        q(f"max(scalerl_buffer_oldest_pending_version_lag{{{SEL}}})", legend="oldest pending group", ref="C"),
        w=8,
    ))
    d = d.with_panel(ts(
        "Weight update pause (p50/p99) and interruptions", "s",
        q(f"histogram_quantile(0.5, sum by (le) (rate(scalerl_generator_update_pause_seconds_bucket{{{SEL}}}[$__rate_interval])))",
          legend="p50", ref="A"),
        q(f"histogram_quantile(0.99, sum by (le) (rate(scalerl_generator_update_pause_seconds_bucket{{{SEL}}}[$__rate_interval])))",
          legend="p99", ref="B"),
        q(f"sum(rate(scalerl_generator_interruptions_total{{{SEL}}}[$__rate_interval]))", legend="interruptions/s", ref="C"),
        w=8,
    ))
    d = d.with_row(db.Row("Replay buffer"))
    d = d.with_panel(ts(
        "Buffer backlog", "short",
        q(f"sum(scalerl_buffer_backlog_groups{{{SEL}}})", legend="backlog groups", ref="A"),
        q(f"sum(scalerl_buffer_pool_prompts{{{SEL}}})", legend="pool prompts", ref="B"),
        q(f"sum(scalerl_buffer_retired_prompts{{{SEL}}})", legend="retired prompts", ref="C"),
        w=8,
    ))
    # No-Positive-Resampling: from the second pass on, only the prompts the policy failed are left; a pass-rate
    # fall that starts at an epoch boundary is the policy forgetting the retired ones (docs/operations.md).
    d = d.with_panel(ts(
        "Prompt pool epoch and retired prompts found forgotten", "short",
        q(f"max(scalerl_buffer_prompt_epoch{{{SEL}}})", legend="epoch", ref="A"),
        q(f"sum(scalerl_buffer_prompts_unretired_total{{{SEL}}})", legend="rechecks failed (back in the pool)",
          ref="B"),
        w=8,
    ))
    d = d.with_panel(ts(
        "Groups written / trained / dropped by reason", "short",
        q(f"sum(rate(scalerl_buffer_groups_written_total{{{SEL}}}[$__rate_interval]))", legend="written", ref="A"),
        q(f"sum(rate(scalerl_buffer_groups_trained_total{{{SEL}}}[$__rate_interval]))", legend="trained", ref="B"),
        q(f"sum by (reason) (rate(scalerl_buffer_groups_dropped_total{{{SEL}}}[$__rate_interval]))",
          legend="dropped: {{reason}}", ref="C"),
        w=8,
    ))
    d = d.with_row(db.Row("Learner"))
    d = d.with_panel(ts(
        "Learner step time (p50/p95)", "s",
        q(f"histogram_quantile(0.5, sum by (le) (rate(scalerl_learner_step_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))",
          legend="p50", ref="A"),
        q(f"histogram_quantile(0.95, sum by (le) (rate(scalerl_learner_step_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))",
          legend="p95", ref="B"),
        w=8,
    ))
    d = d.with_panel(ts(
        "Learner starved fraction", "percentunit",
        q(f"sum(rate(scalerl_learner_starved_seconds_total{{{SEL}}}[$__rate_interval]))", legend="starved", ref="A"),
        w=8,
    ))
    d = d.with_panel(ts(
        "Policy version and validation pass rate", "short",
        q(f"max(scalerl_learner_policy_version{{{SEL}}})", legend="learner version", ref="A"),
        q(f"max(scalerl_weights_version{{{SEL}}})", legend="published version", ref="B"),
        q(f"max(scalerl_learner_validation_pass_rate{{{SEL}}})", legend="validation pass rate", ref="C"),
        w=8,
    ))
    d = d.with_panel(ts(
        "Generator vs learner policy", "short",
        q(f"max(scalerl_learner_sampler_kl{{{SEL}}})", legend="sampler KL (k3)", ref="A"),
        q(f"max(scalerl_learner_clipped_token_ratio{{{SEL}}})", legend="clipped token share", ref="B"),
        desc="How far the policy the generators sampled with is from the learner's, on the trained tokens. "
             "Staleness (PipelineRL-k) keeps it small and steady; a jump means a weight update did not land.",
        w=12,
    ))
    d = d.with_panel(ts(
        "Largest importance ratio", "short",
        q(f"max(scalerl_learner_importance_ratio_max{{{SEL}}})", legend="max ratio", ref="A"),
        w=12,
    ))
    d = d.with_panel(ts(
        "Learning rate", "short",
        q(f"max(scalerl_learner_learning_rate{{{SEL}}})", legend="lr", ref="A"),
        desc="The recipe's lr after warmup; with optimizer.adaptive_lr it drops while the sampler KL runs high.",
        w=12,
    ))
    d = d.with_row(db.Row("Weights and control plane"))
    d = d.with_panel(ts(
        "Weight broadcast", "Bps",
        q(f"sum(rate(scalerl_weights_published_bytes_total{{{SEL}}}[$__rate_interval]))", legend="published bytes/s", ref="A"),
        w=8,
    ))
    d = d.with_panel(ts(
        "Weights publish time (p50), by how it went", "s",
        q(f"histogram_quantile(0.5, sum by (le, sent_as) (rate(scalerl_learner_weights_publish_duration_seconds_bucket{{{SEL}}}[$__rate_interval])))",
          legend="{{sent_as}}", ref="A"),
        desc="The staged copy to the hub's answer, per version. With `delta: auto` the learner takes the faster "
             "way and tries the other every 16 publishes, so both lines stay fresh; a delta saves bytes but costs "
             "CPU on the learner and every generator.",
        w=8,
    ))
    d = d.with_panel(ts(
        "Learner time held by publishing", "percentunit",
        q(f"sum(rate(scalerl_learner_weights_publish_held_seconds_total{{{SEL}}}[$__rate_interval]))",
          legend="held", ref="A"),
        desc="Share of the learner's wall time spent waiting on weights: the copy of each version, the previous "
             "version's send when it outlasts a step, and every send when pipeline.publish_in_background is off. "
             "Near the publish time divided by the step time means the transport, not training, sets the pace.",
        w=8,
    ))
    d = d.with_panel(st("Weight subscribers", "none", q(f"max(scalerl_weights_subscribers{{{SEL}}})"), w=4, h=8))
    d = d.with_panel(ts(
        "Jobs by state", "short",
        q('sum by (state) (scalerl_api_jobs{namespace=~"$namespace"})', legend="{{state}}", ref="A"),
        w=12,
    ))
    return d.build()


DASHBOARDS = {
    "scalerl-forecast.json": forecast_dashboard,
    "scalerl-pipeline.json": pipeline_dashboard,
}


def render() -> dict[str, str]:
    out = {}
    for name, fn in DASHBOARDS.items():
        board = json.loads(json.dumps(fn(), cls=JSONEncoder))
        for panel in board.get("panels", []):
            if panel.get("type") != "row":  # the builders have no setter; Grafana migrates a panel by it
                panel["pluginVersion"] = GRAFANA_VERSION
        out[name] = json.dumps(board, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed dashboards differ from the code")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    rendered = render()
    if args.check:
        stale = [n for n, text in rendered.items()
                 if not (args.out / n).exists() or (args.out / n).read_text() != text]
        extra = sorted(p.name for p in args.out.glob("*.json") if p.name not in rendered)
        if stale or extra:
            print(f"dashboards stale: {stale}; unexpected files: {extra}. Run: make dashboards", file=sys.stderr)
            return 1
        print(f"dashboards up to date ({len(rendered)})")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
