"""The task and verifier units and their registries.

A task is a deterministic prompt source (train and validation splits), the verifiers that can grade its
completions (the first is its own) and the packages it needs. A verifier maps (response, reference answer,
prompt metadata) to a reward in [0, 1] or raises; the reward-grader turns a raise or a timeout into
GRADE_STATUS_FAILED (never reward 0).

The registries hold names and functions only: heavy packages are imported inside the functions that use them,
and declared as import names that are checked when the unit is used, so that the api can validate a recipe
against the registry without installing any task's packages.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from scalerl.errors import InvalidArgument, NotFound

Split = Literal["train", "validation", "all"]
"""`all`: every prompt a source has (a downstream file set is a whole file); only the `file` task serves it."""


@dataclass(frozen=True)
class TaskPrompt:
    prompt_id: str
    text: str
    answer: str
    task: str
    """Verifier name the reward-grader dispatches on (`GradeItem.task`)."""
    metadata: dict = field(default_factory=dict)

    @property
    def metadata_json(self) -> str:
        return json.dumps(self.metadata, sort_keys=True)


class TaskSettings(Protocol):
    """What a prompt source reads from the recipe's `task` section (`scalerl.recipe.TaskConfig`)."""

    name: str
    verifier: str | None
    num_train_prompts: int
    num_validation_prompts: int
    difficulty: Mapping[str, float]
    seed: int


PromptSource = Callable[[TaskSettings, Split, int, str], list[TaskPrompt]]
"""(task settings, split, number of prompts, verifier name) -> prompts, the same for the same arguments."""

VerifierFn = Callable[[str, str, dict], float]
"""(response, reference answer, prompt metadata) -> reward in [0, 1]; raises when it cannot grade."""


class MissingPackages(ImportError):
    """A task or verifier was used in an environment that lacks the packages it declares."""


def require_packages(packages: tuple[str, ...], needed_by: str) -> None:
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingPackages(f"{needed_by} needs the Python package(s) {', '.join(missing)}, which are not "
                              "installed here (they come with `scalerl-shared[tasks]`)")


@dataclass(frozen=True)
class Task:
    name: str
    """The recipe's `task.name`; with `family`, the prefix of `name/<member>` (e.g. `reasoning_gym/<dataset>`)."""
    prompts: PromptSource
    verifiers: tuple[str, ...]
    """Verifiers that can grade this task; the first is its own (the default of `task.verifier`)."""
    packages: tuple[str, ...] = ()
    """Import names the prompt source needs."""
    family: bool = False
    """Registered under a prefix: the recipe names one member as `name/<member>`."""

    @property
    def pattern(self) -> str:
        return f"{self.name}/<dataset>" if self.family else self.name


@dataclass(frozen=True)
class Verifier:
    name: str
    """The recipe's `task.verifier` and the grader's `GradeItem.task`."""
    fn: VerifierFn
    packages: tuple[str, ...] = ()
    """Import names the verifier needs."""
    family: bool = False
    """Also answers to `name/<member>` (the grader's task label then keeps the member, e.g. the dataset)."""

    def __call__(self, response: str, answer: str, metadata: dict) -> float:
        require_packages(self.packages, f"verifier {self.name!r}")
        return self.fn(response, answer, metadata)


TASKS: dict[str, Task] = {}
VERIFIERS: dict[str, Verifier] = {}


def register_task(task: Task) -> Task:
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is registered already")
    TASKS[task.name] = task
    return task


def register_verifier(verifier: Verifier) -> Verifier:
    if verifier.name in VERIFIERS:
        raise ValueError(f"verifier {verifier.name!r} is registered already")
    VERIFIERS[verifier.name] = verifier
    return verifier


def _lookup(registry: Mapping, name: str):
    unit = registry.get(name)
    if unit is not None:
        return None if unit.family else unit
    prefix, _, member = name.partition("/")
    unit = registry.get(prefix)
    return unit if unit is not None and unit.family and member else None


def find_task(name: str) -> Task | None:
    """The task a recipe's `task.name` names, or None (a family needs a member: `reasoning_gym/<dataset>`)."""
    return _lookup(TASKS, name)


def get_task(name: str) -> Task:
    task = find_task(name)
    if task is None:
        raise InvalidArgument(f"unknown task {name!r} (registered: {', '.join(task_names())})", field="task.name")
    return task


def find_verifier(name: str) -> Verifier | None:
    """The verifier a grade item names: a registered name, or `family/<member>` for a family verifier."""
    unit = VERIFIERS.get(name)
    return unit if unit is not None else _lookup(VERIFIERS, name)


def get_verifier(name: str) -> Verifier:
    verifier = find_verifier(name)
    if verifier is None:
        raise NotFound(f"no verifier for {name!r} (registered: {', '.join(verifier_patterns())})", field="task")
    return verifier


def task_names() -> list[str]:
    return sorted(task.pattern for task in TASKS.values())


def verifier_names() -> list[str]:
    return sorted(VERIFIERS)


def verifier_patterns() -> list[str]:
    return sorted(f"{v.name} or {v.name}/<dataset>" if v.family else v.name for v in VERIFIERS.values())


def split_seed(cfg: TaskSettings, split: Split) -> int:
    """A seed per (task, recipe seed, split): the two splits draw independently."""
    digest = hashlib.sha256(f"{cfg.name}:{cfg.seed}:{split}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def final_answer_text(response: str) -> str:
    """The part after the reasoning: text after the last </think> if there is one."""
    return response.rsplit("</think>", 1)[-1]
