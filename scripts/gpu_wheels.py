#!/usr/bin/env python
"""Wheels that a CUDA image with torch and transformers (the device machine's) lacks for `make gpu-check`, at the
versions this venv runs, downloaded for CPython 3.12 on x86-64 Linux into `.whl/` (or --dest).

On the GPU machine:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD/shared:$PWD/services/learner:$PWD/services/weight-broadcast
    python3 -m pytest services/learner/tests -m gpu && python3 scripts/gpu_check.py
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys

PACKAGES = ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "protobuf",
            "grpcio", "grpcio-health-checking", "grpcio-reflection", "googleapis-common-protos", "prometheus_client")
"""What our learner and weight-broadcast code import beyond torch, transformers, safetensors, numpy and xxhash;
grpcio and protobuf go too because our generated code needs at least the versions it was generated with."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=".whl")
    ap.add_argument("--python-version", default="3.12")
    args = ap.parse_args()
    pins = [f"{name}=={md.version(name)}" for name in PACKAGES]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           args.python_version, "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS], "-d", args.dest,
           *pins]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
