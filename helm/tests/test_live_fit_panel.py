"""The live-fit panel is written in the XY chart schema of the Grafana version the dashboards are generated for:
its options and overrides read back through that version's SDK models unchanged, it names one frame and the
fields the queries produce (the e2e Prometheus test checks those fields have data while a job runs)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import xychart as xm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gen_dashboards  # noqa: E402


def xy_panels() -> list[dict]:
    board = json.loads((ROOT / "helm/scalerl/dashboards/scalerl-forecast.json").read_text())
    return [p for p in board["panels"] if p["type"] == "xychart"]


def panel() -> dict:
    return next(p for p in xy_panels() if p["title"] == gen_dashboards.LIVE_FIT_TITLE)


def roundtrip(model, data: dict) -> dict:
    return json.loads(json.dumps(model.from_json(data), cls=JSONEncoder))


def test_options_and_overrides_are_the_sdk_versions_schema():
    p = panel()
    assert p["pluginVersion"] == gen_dashboards.GRAFANA_VERSION == "11.6.0"
    assert roundtrip(xm.Options, p["options"]) == p["options"]  # no key the 11.6 model does not know
    assert xm.SeriesMapping(p["options"]["mapping"]) is xm.SeriesMapping.MANUAL
    assert roundtrip(dm.FieldConfigSource, p["fieldConfig"]) == p["fieldConfig"]
    for override in p["fieldConfig"]["overrides"]:
        for prop in override["properties"]:
            if prop["id"] == "custom.show":
                xm.XYShowMode(prop["value"])  # a valid show mode
    assert {o["matcher"]["options"] for o in p["fieldConfig"]["overrides"]} == {
        "fit", "lower", "upper", "validation pass rate"}


def test_both_xy_panels_are_the_sdk_versions_schema():
    panels = xy_panels()
    assert {p["title"] for p in panels} == {gen_dashboards.LIVE_FIT_TITLE, gen_dashboards.COMPARE_TITLE}
    for p in panels:
        assert p["pluginVersion"] == "11.6.0"
        assert roundtrip(xm.Options, p["options"]) == p["options"]
        assert roundtrip(dm.FieldConfigSource, p["fieldConfig"]) == p["fieldConfig"]


@pytest.mark.parametrize("title", [gen_dashboards.LIVE_FIT_TITLE, gen_dashboards.COMPARE_TITLE])
def test_every_series_names_a_field_a_query_produces(title):
    p = next(p for p in xy_panels() if p["title"] == title)
    renames = next(t for t in p["transformations"] if t["id"] == "organize")["options"]["renameByName"]
    produced = {renames[f"Value #{t['refId']}"] for t in p["targets"]}
    joins = [t for t in p["transformations"] if t["id"] == "joinByField"]
    assert len(joins) == 1 and joins[0]["options"]["byField"] == "point"  # one frame: byIndex 0
    for t in p["targets"]:
        assert t["instant"] and t["format"] == "table" and re.search(r"by \(point\)", t["expr"]), t
    for s in p["options"]["series"]:
        assert s["frame"]["matcher"] == {"id": "byIndex", "options": 0}
        assert {s["x"]["matcher"]["options"], s["y"]["matcher"]["options"]} <= produced, s
    # the measured points are indexed gauges like the curve, not range queries on the latest point
    assert any("scalerl_forecaster_point_pass_rate" in t["expr"] for t in p["targets"])
    assert {o["matcher"]["options"] for o in p["fieldConfig"]["overrides"]} <= produced
