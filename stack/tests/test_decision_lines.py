"""What `scalerl status` prints of the scale-or-stop advice and `scalerl compare` of a comparison, from the api's
JSON (the commands themselves run against a live stack in e2e_tests/test_decisions_e2e.py)."""

from __future__ import annotations

from scalerl_stack.cli import app
from scalerl_stack.client import format_comparison, format_decision

DECISION = {"job_id": "j1", "spent": 2.0, "level": 0.8, "recommendation": "continue",
            "reason": "10x the compute gains +0.0900", "target": 0.6, "compute_to_target": 7.5,
            "compute_to_target_interval": [5.0, 11.0], "compute_to_identify": None,
            "predictions": [{"compute": 4.0, "value": 0.5, "interval": [0.48, 0.52]},
                            {"compute": 8.0, "value": 0.55, "interval": [0.52, 0.58]},
                            {"compute": 20.0, "value": 0.6, "interval": [0.55, 0.64]}]}


def test_advice_lines_show_recommendation_predictions_and_target():
    text = format_decision(DECISION)
    assert text.startswith("advice: CONTINUE: 10x the compute gains")
    assert "2x (4): 0.500 [0.480, 0.520]" in text and "10x (20): 0.600 [0.550, 0.640]" in text
    assert "target 0.600 at compute 7.5 [5, 11]" in text


def test_a_target_the_bands_lower_end_never_reaches_prints_never():
    # REST sends the open upper end as null; the line formatted None as a number: `scalerl status` and `decide` crashed
    text = format_decision(DECISION | {"compute_to_target_interval": [5.0, None]})
    assert "target 0.600 at compute 7.5 [5, never]" in text


def test_a_target_past_the_fitted_ceiling_prints_the_interval_the_band_gives_it():
    text = format_decision(DECISION | {"compute_to_target": None, "compute_to_target_interval": [9.0, None]})
    assert "target 0.600: not reachable by the fit (80% interval [9, never])" in text
    text = format_decision(DECISION | {"compute_to_target": None, "compute_to_target_interval": None})
    assert "target 0.600: not reachable by the fit\n" in text + "\n" and "interval" not in text


def test_undecidable_advice_says_where_the_fit_becomes_identifiable():
    text = format_decision(DECISION | {"recommendation": "not decidable yet", "compute_to_identify": 9.5,
                                       "target": None})
    assert text.startswith("advice: NOT DECIDABLE YET") and "identifiable at compute 9.5" in text
    assert "target" not in text


def test_comparison_table_puts_both_jobs_side_by_side():
    job = {"job_id": "a1", "name": "base", "params": {"A": 0.61, "B": 1.9, "C_mid": 25.0},
           "intervals": {"A": [0.6, 0.62], "B": [1.7, 2.1], "C_mid": [23.0, 27.0]}}
    cmp = {"jobs": [job, job | {"job_id": "b1", "name": "", "params": job["params"] | {"A": 0.67}}],
           "level": 0.95, "verdict": "ceiling mover", "higher_ceiling": "b1", "more_efficient": None, "notes": [],
           "warnings": ["different models: ..."]}
    lines = format_comparison(cmp).splitlines()
    assert "a = base" in lines[0] and "b = b1" in lines[0]
    assert lines[1].startswith("A") and "0.61 95% [0.6, 0.62]" in lines[1] and "0.67 95%" in lines[1]
    assert "verdict at 95%: ceiling mover" in lines and "  higher ceiling: b1" in lines
    assert lines[-1] == "warning: different models: ..."


def test_compare_and_decide_are_commands():
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {"compare", "decide"} <= names
