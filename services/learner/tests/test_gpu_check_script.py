"""scripts/gpu_check.py on a machine without CUDA: its arguments, where it writes, and a clear refusal (exit 2,
the reason in the JSON and on stderr). The CUDA sections run only on a GPU (`make gpu-check`)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments_and_output_path(gpu_check, tmp_path):
    args = gpu_check.parse_args([])
    assert args.sections == ["learner", "fsdp", "vllm", "weights"] and args.out is None
    assert gpu_check.output_path(args, {"OUT": str(tmp_path)}) == tmp_path / "gpu_check.json"
    assert gpu_check.output_path(args, {}) == Path("gpu_check.json")
    args = gpu_check.parse_args(["--out", str(tmp_path / "x.json"), "--sections", "fsdp"])
    assert gpu_check.output_path(args, {"OUT": "/elsewhere"}) == tmp_path / "x.json"
    assert args.sections == ["fsdp"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--sections", "nope"])


def test_write_result_round_trips(gpu_check, tmp_path):
    path = tmp_path / "deep" / "r.json"
    gpu_check.write_result(path, {"sections": {"learner": {"step_s": 0.5, "path": Path("/x")}}})
    assert json.loads(path.read_text()) == {"sections": {"learner": {"step_s": 0.5, "path": "/x"}}}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_it_refuses_clearly(tmp_path):
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert "CUDA is not available" in done.stderr
    assert "CUDA is not available" in json.loads(out.read_text())["error"]
