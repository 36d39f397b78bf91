"""Helpers of the end-to-end tests."""

from __future__ import annotations

import contextlib
import copy
import os
import time
from pathlib import Path

from scalerl.ports import unused_port
from scalerl.testing import sharing_models
from scalerl_stack.supervisor import Stack

STACK_ENV = {"SCALERL_POLL_INTERVAL_S": "0.5", "SCALERL_LOG_JSON": "true", "SCALERL_MAX_GROUPS_IN_FLIGHT": "8"}

TINY_RECIPE = {
    "model": {"path": "builtin:tiny-arithmetic", "max_model_len": 64},
    "task": {"num_train_prompts": 256, "num_validation_prompts": 16},
    "optimizer": {"lr": 3e-4, "warmup_steps": 2},
    "pipeline": {"prompts_per_batch": 8, "generations_per_prompt": 4, "max_staleness": 4},
    "generation": {"thinking_budget_low": 24, "thinking_budget_high": 32, "solution_budget": 8},
    "validation": {"num_prompts": 16, "samples_per_prompt": 2},
    "forecast": {"min_compute": 0.0},
}
"""What the short jobs on the tiny model share; each test adds its validation cadence and budget."""


def tiny_recipe(**overrides) -> dict:
    """TINY_RECIPE with `overrides` merged in: a dict merges into the section it names (other keys stay), any
    other value replaces."""
    return copy.deepcopy(deep_merged(TINY_RECIPE, overrides))


def deep_merged(base: dict, overrides: dict) -> dict:
    result = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            value = deep_merged(base[key], value)
        result[key] = value
    return result


@contextlib.contextmanager
def running_stack(data_dir: Path, token: str, **stack_args):
    """Every service on free local ports under the supervisor, until SERVING; yields (stack, api URL). On exit
    the stack stops, the environment is restored and each service's log tail is printed."""
    http_port = unused_port()
    saved = dict(os.environ)
    os.environ.update({"SCALERL_API_TOKEN": token, "SCALERL_HTTP_PORT": str(http_port), **STACK_ENV})
    os.environ.pop("REDIS_URL", None)
    stack = Stack(sharing_models(data_dir), free_ports=True, **stack_args)
    stack.start()
    try:
        if not stack.wait_serving(300):
            raise RuntimeError(f"stack not SERVING: {stack.health()}; logs in {data_dir / 'logs'}")
        yield stack, f"http://127.0.0.1:{http_port}"
    finally:
        stack.stop()
        os.environ.clear()
        os.environ.update(saved)
        for log in sorted((Path(data_dir) / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print(f"==== {log.name}\n" + "\n".join(tail))


def wait_for(predicate, timeout: float, interval: float = 1.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
