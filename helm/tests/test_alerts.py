"""`promtool test rules` on every alert (helm/tests/alerts_test.yaml): each fires on its condition and not on a
healthy job, a job whose series were removed when it ended, or compute the evaluator spent."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parent / "scalerl" / "files" / "alerts.rules.yaml"
TESTS = HERE / "alerts_test.yaml"


def test_every_alert_has_a_firing_and_a_quiet_case():
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert firing == alerts, alerts - firing
    assert quiet == alerts, alerts - quiet


def test_promtool_alert_unit_tests(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run `make k8s-tools` (apt-get install prometheus)", pytrace=False)
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # promtool compares annotations verbatim; their text is not under test
    (tmp_path / "alerts.rules.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(TESTS, tmp_path / "alerts_test.yaml")
    proc = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
