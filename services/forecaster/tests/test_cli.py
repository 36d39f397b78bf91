import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from scalerl_forecaster.cli import forecast_app
from scalerl_forecaster.csvio import write_curve
from scalerl_forecaster.fit import sigmoid_curve

runner = CliRunner()


def _write(path, Cm=2542, B=1.92, A=0.61, end=20_000, seed=0):
    rng = np.random.default_rng(seed)
    c = np.concatenate([[0.0], np.arange(150, end + 1e-9, 150.0)])
    write_curve(path, c, rng.binomial(16000, sigmoid_curve(c, A, B, Cm, 0.3)) / 16000)
    return path


@pytest.fixture
def curve(tmp_path):
    return _write(tmp_path / "curve.csv")


def test_fit_human_readable(curve):
    res = runner.invoke(forecast_app, ["fit", str(curve), "--predict-at", "16000"])
    assert res.exit_code == 0, res.output
    assert "sigmoid fit" in res.stdout
    assert "A     =" in res.stdout and "C_mid =" in res.stdout
    assert "predicted at 1.6e+04" in res.stdout


def test_fit_json_shape(curve):
    res = runner.invoke(
        forecast_app, ["fit", str(curve), "--json", "--predict-at", "16000", "--predict-at", "32000", "--level", "0.9"]
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert set(d) == {"model", "params", "intervals", "predictions", "identifiable", "warnings"}
    assert d["model"] == "sigmoid"
    assert set(d["params"]) == {"A", "B", "C_mid", "R0"}
    assert d["params"]["A"] == pytest.approx(0.61, abs=0.01)
    assert [p["compute"] for p in d["predictions"]] == [16000.0, 32000.0]
    for p in d["predictions"]:
        lo, hi = p["interval"]
        assert lo <= p["value"] <= hi
    assert d["identifiable"] is True


def test_fit_min_compute_and_fit_until(curve):
    res = runner.invoke(forecast_app, ["fit", str(curve), "--json", "--min-compute", "3000", "--fit-until", "9000"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["params"]["C_mid"] == pytest.approx(2542, rel=0.1)


@pytest.mark.parametrize("model,keys", [("power", {"A", "B", "D", "R0"}), ("paper", {"A", "B", "C_mid", "R0"})])
def test_fit_other_models(curve, model, keys):
    res = runner.invoke(forecast_app, ["fit", str(curve), "--json", "--model", model, "--predict-at", "16000"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["model"] == model and set(d["params"]) == keys


def test_fit_plot(curve, tmp_path):
    out = tmp_path / "fit.png"
    res = runner.invoke(forecast_app, ["fit", str(curve), "--plot", str(out), "--predict-at", "40000"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare(tmp_path):
    a = _write(tmp_path / "a.csv", A=0.61, seed=1)
    b = _write(tmp_path / "b.csv", A=0.66, seed=2)
    res = runner.invoke(forecast_app, ["compare", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "higher ceiling: b" in res.stdout
    assert "ceiling mover" in res.stdout
    res = runner.invoke(forecast_app, ["compare", str(a), str(b), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["higher_ceiling"] == "b" and d["verdict"] == "ceiling mover"


def _bad(tmp_path, text):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    return p


def _rows(pairs):
    return "compute,value\n" + "".join(f"{c},{v}\n" for c, v in pairs)


GOOD = [(0, 0.3)] + [(1500 + 150 * i, 0.4 + 0.01 * i) for i in range(10)]


@pytest.mark.parametrize(
    "text, extra, match",
    [
        ("", [], "empty file"),
        ("\n\n", [], "empty file"),
        ("compute,value\n", [], "no data rows"),
        ("0,0.3\n1500,0.4\n1650,0.41\n", [], "missing header"),
        (_rows([(0, 0.3), (1650, 0.4), (1500, 0.41)] + GOOD[3:]), [], "strictly increasing"),
        (_rows(GOOD[:4] + [(1950, 1.3)] + GOOD[5:]), [], r"\[0, 1\]"),
        (_rows(GOOD[:4] + [(1950, -0.2)] + GOOD[5:]), [], r"\[0, 1\]"),
        (_rows(GOOD[:4]), [], "too few points"),
        (_rows(GOOD), ["--min-compute", "2900"], "too few points"),
        ("compute,value\n0,0.3\n1500,abc\n", [], "expected two numbers"),
        (_rows(GOOD), ["--model", "cubic"], "unknown model"),
    ],
)
def test_fit_bad_input_exit_2(tmp_path, text, extra, match):
    import re

    p = _bad(tmp_path, text)
    res = runner.invoke(forecast_app, ["fit", str(p), *extra])
    assert res.exit_code == 2, res.output
    assert re.search(match, res.stderr), res.stderr
    assert res.stderr.startswith("error: ")
    assert res.stdout == ""


def test_fit_missing_file_exit_2(tmp_path):
    res = runner.invoke(forecast_app, ["fit", str(tmp_path / "nope.csv")])
    assert res.exit_code == 2
    assert "no such file" in res.stderr


def test_compare_bad_input_exit_2(tmp_path, curve):
    p = _bad(tmp_path, "")
    res = runner.invoke(forecast_app, ["compare", str(curve), str(p)])
    assert res.exit_code == 2
    assert "empty file" in res.stderr


def test_cli_import_is_light():
    code = (
        "import sys, scalerl_forecaster.cli as c; assert c.forecast_app is not None; "
        "heavy = [m for m in ('scipy', 'matplotlib', 'numpy') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
