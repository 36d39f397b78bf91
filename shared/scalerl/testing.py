"""Test helpers shared by the suites: the builtin models, built once per checkout."""

from __future__ import annotations

import os
from pathlib import Path

MODEL_CACHE = Path(os.environ.get("SCALERL_TEST_MODEL_CACHE", Path(__file__).resolve().parents[2] / "var" / "models"))
"""Builtin models built / converted once per checkout and shared by the tests (and by `make run`, whose data dir is
`var/`): the tiny model's warm-up takes a minute or two, SmolLM2's conversion ~30 s."""


def sharing_models(data_dir: Path) -> Path:
    """Point `data_dir/models` at MODEL_CACHE, with the builtin tiny model built there; returns `data_dir`."""
    from scalerl.models import resolve_model_path

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if not (data_dir / "models").exists():
        MODEL_CACHE.mkdir(parents=True, exist_ok=True)
        (data_dir / "models").symlink_to(MODEL_CACHE.resolve(), target_is_directory=True)
    resolve_model_path("builtin:tiny-arithmetic", data_dir)
    return data_dir
