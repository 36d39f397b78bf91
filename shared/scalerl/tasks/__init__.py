"""Tasks: prompt sets built deterministically from a recipe's `task` section (no downloads), and the
verifiers that grade them, each a registered unit (`base.Task`, `base.Verifier`).

`arithmetic` is the built-in task of the tiny demo model; `reasoning_gym/<dataset>` draws procedurally
generated prompts from reasoning-gym; `file` reads the user's JSONL or Parquet file. Importing this package registers them and imports no heavy package.
"""

from __future__ import annotations

from scalerl.tasks import arithmetic, files, math_verifier, reasoning_gym  # noqa: F401  (registers the units)
from scalerl.tasks.arithmetic import arithmetic_prompt, exact_numeric, is_validation_pair
from scalerl.tasks.base import (TASKS, VERIFIERS, MissingPackages, Split, Task, TaskPrompt, TaskSettings, Verifier,
                                final_answer_text, find_task, find_verifier, get_task, get_verifier,
                                register_task, register_verifier, require_packages, task_names, verifier_names)
from scalerl.tasks.math_verifier import math_answer
from scalerl.tasks.reasoning_gym import reasoning_gym_score

__all__ = [
    "TASKS", "VERIFIERS", "MissingPackages", "Split", "Task", "TaskPrompt", "TaskSettings", "Verifier",
    "arithmetic_prompt", "build_prompts", "exact_numeric", "final_answer_text", "find_task", "find_verifier",
    "get_task", "get_verifier", "is_validation_pair", "math_answer", "reasoning_gym_score", "register_task",
    "register_verifier", "require_packages", "task_names", "verifier_names",
]


def build_prompts(cfg: TaskSettings, split: Split) -> list[TaskPrompt]:
    """The `split` prompts of the recipe's task, each naming the verifier that grades it."""
    task = get_task(cfg.name)
    require_packages(task.packages, f"task {cfg.name!r}")
    n = cfg.num_train_prompts if split == "train" else cfg.num_validation_prompts
    return task.prompts(cfg, split, n, cfg.verifier or task.verifiers[0])
