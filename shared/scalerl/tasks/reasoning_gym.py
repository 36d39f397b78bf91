"""`reasoning_gym/<dataset>`: procedurally generated prompts from reasoning-gym, graded by the dataset's own
scorer (the `reasoning_gym` verifier). The package is imported only when prompts are built or graded."""

from __future__ import annotations

import json

from scalerl.tasks.base import (Split, Task, TaskPrompt, TaskSettings, Verifier, final_answer_text,
                                register_task, register_verifier, split_seed)

PACKAGES = ("reasoning_gym",)


def reasoning_gym_prompts(cfg: TaskSettings, split: Split, n: int, verifier: str) -> list[TaskPrompt]:
    import reasoning_gym

    dataset_name = cfg.name.split("/", 1)[1]
    data = reasoning_gym.create_dataset(dataset_name, size=n, seed=split_seed(cfg, split) % (2**31))
    # With its own scorer the grade item names the dataset (`reasoning_gym/<dataset>`: the grader's task label).
    grade_as = cfg.name if verifier == "reasoning_gym" else verifier
    out = []
    for i, entry in enumerate(data):
        meta = {"dataset": dataset_name, "entry": json.loads(json.dumps(entry, default=str))}
        out.append(TaskPrompt(f"{split}-{i}", entry["question"], str(entry["answer"]), grade_as, meta))
    return out


def reasoning_gym_score(response: str, answer: str, metadata: dict) -> float:
    import reasoning_gym

    dataset = metadata.get("dataset")
    entry = metadata.get("entry")
    if not dataset or entry is None:
        raise ValueError("metadata_json: reasoning_gym tasks need 'dataset' and 'entry'")
    scorer = reasoning_gym.get_score_answer_fn(dataset)
    return float(scorer(final_answer_text(response).strip(), entry))


register_verifier(Verifier("reasoning_gym", reasoning_gym_score, packages=PACKAGES, family=True))
register_task(Task("reasoning_gym", reasoning_gym_prompts, verifiers=("reasoning_gym", "math"), packages=PACKAGES,
                   family=True))
