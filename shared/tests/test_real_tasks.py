"""Real tasks and data: the `file` task (JSONL / Parquet, fields mapped by the recipe, validation held out by id),
reasoning-gym datasets with their own scorers, math-verify on `\\boxed{}` answers, chat-template rendering, and
the recipe checks that refuse a bad dataset or an interruption that cannot fire (422 at submit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from scalerl.prompts import end_of_turn_token_ids, prompt_token_ids, render_text, stop_token_ids
from scalerl.recipe import PromptConfig, Recipe, TaskConfig, eval_set_split, parse_recipe, phrase_token_bound
from scalerl.tasks import build_prompts, get_verifier, math_answer

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"id": f"q{i}", "question": f"What is {i} + {2 * i}?", "solution": str(3 * i)} for i in range(200)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def file_task(path: Path, **dataset) -> TaskConfig:
    return TaskConfig(name="file", num_train_prompts=1000, num_validation_prompts=1000,
                      dataset={"path": str(path), "prompt_field": "question", "answer_field": "solution",
                               "id_field": "id"} | dataset)


def error_locs(exc: ValidationError) -> list[tuple]:
    return [tuple(e["loc"]) for e in exc.errors()]


# ---- the file task ------------------------------------------------------------------------------------------
def test_jsonl_and_parquet_give_the_same_prompts(tmp_path):
    jsonl = file_task(write_jsonl(tmp_path / "d.jsonl", ROWS))
    parquet = file_task(write_parquet(tmp_path / "d.parquet", ROWS))
    for split in ("train", "validation"):
        a, b = build_prompts(jsonl, split), build_prompts(parquet, split)
        assert [(p.prompt_id, p.text, p.answer, p.task) for p in a] == [(p.prompt_id, p.text, p.answer, p.task)
                                                                          for p in b]
    train, val = build_prompts(jsonl, "train"), build_prompts(jsonl, "validation")
    assert {p.prompt_id.split("-", 1)[1] for p in train}.isdisjoint({p.prompt_id.split("-", 1)[1] for p in val})
    assert len(train) + len(val) == len(ROWS) and 5 <= len(val) <= 40  # ~10 % held out
    assert train[0].text == "What is 0 + 0?" and train[0].answer == "0" and train[0].task == "math"


def test_validation_split_is_held_out_by_id_not_by_position(tmp_path):
    forward = file_task(write_jsonl(tmp_path / "a.jsonl", ROWS))
    shuffled = file_task(write_jsonl(tmp_path / "b.jsonl", ROWS[::-1] + [
        {"id": "new", "question": "What is 1 + 1?", "solution": "2"}]))
    ids = lambda cfg: {p.metadata["id"] for p in build_prompts(cfg, "validation")}  # noqa: E731
    assert ids(forward) == ids(shuffled) - {"new"}


def test_num_prompts_caps_and_rows_name_their_verifier(tmp_path):
    rows = [r | {"grader": "exact_numeric" if i % 2 else ""} for i, r in enumerate(ROWS)]
    cfg = TaskConfig(name="file", num_train_prompts=10, dataset={
        "path": str(write_jsonl(tmp_path / "d.jsonl", rows)), "prompt_field": "question",
        "answer_field": "solution", "verifier_field": "grader"})
    prompts = build_prompts(cfg, "train")
    assert len(prompts) == 10
    assert {p.task for p in prompts} == {"math", "exact_numeric"}


def test_a_row_missing_a_field_is_named_when_prompts_are_built(tmp_path):
    cfg = file_task(write_jsonl(tmp_path / "d.jsonl", ROWS[:5] + [{"id": "x", "question": "q?"}]))
    with pytest.raises(ValueError, match="task.dataset.answer_field: record 5 has no 'solution'"):
        build_prompts(cfg, "train") + build_prompts(cfg, "validation")


@pytest.mark.parametrize("case, loc", [
    ("missing", ("task", "dataset", "path")),
    ("empty", ("task", "dataset", "path")),
    ("directory", ("task", "dataset", "path")),
    ("not_parquet", ("task", "dataset", "prompt_field")),
    ("no_answer_field", ("task", "dataset", "answer_field")),
    ("unknown_task", ("task", "name")),
    ("no_dataset", ("task",)),
])
def test_a_bad_dataset_is_refused_naming_the_field(tmp_path, case, loc):
    good = write_jsonl(tmp_path / "good.jsonl", ROWS)
    dataset = {"path": str(good), "prompt_field": "question", "answer_field": "solution"}
    task: dict = {"name": "file", "dataset": dataset}
    if case == "missing":
        dataset["path"] = str(tmp_path / "nope.jsonl")
    elif case == "empty":
        dataset["path"] = str(write_jsonl(tmp_path / "empty.jsonl", []))
    elif case == "directory":
        dataset["path"] = str(tmp_path)
    elif case == "not_parquet":
        (tmp_path / "bad.parquet").write_text("not parquet")
        dataset["path"] = str(tmp_path / "bad.parquet")
    elif case == "no_answer_field":
        dataset["answer_field"] = "answer"
    elif case == "unknown_task":
        task["name"] = "no_such_task"
    elif case == "no_dataset":
        del task["dataset"]
    with pytest.raises(ValidationError) as info:
        parse_recipe({"task": task})
    assert loc in error_locs(info.value), info.value


def test_a_bad_dataset_is_a_422_at_submit_naming_the_field(tmp_path):
    pytest.importorskip("scalerl_api")
    from fastapi.testclient import TestClient

    from scalerl.settings import Settings
    from scalerl_api.backends import Backends
    from scalerl_api.main import create_app

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'jobs.db'}", api_token="t",
                        replay_buffer_addr="127.0.0.1:9", forecaster_addr="127.0.0.1:9")
    backends = Backends(settings)
    try:
        with TestClient(create_app(settings, backends), headers={"Authorization": "Bearer t"}) as client:
            recipe = {"task": {"name": "file", "dataset": {"path": str(tmp_path / "missing.jsonl")}}}
            resp = client.post("/v1/jobs", json={"recipe": recipe})
            assert resp.status_code == 422
            locs = [e["loc"] for e in resp.json()["detail"]]
            assert ["body", "recipe", "task", "dataset", "path"] in locs, resp.text
            assert "does not exist" in resp.text
            recipe = {"validation": {"eval_sets": [{"task": "file", "name": "bench", "dataset": {
                "path": str(tmp_path / "missing.jsonl")}}]}}
            resp = client.post("/v1/jobs", json={"recipe": recipe})
            assert resp.status_code == 422
            locs = [e["loc"] for e in resp.json()["detail"]]
            assert ["body", "recipe", "validation", "eval_sets", 0, "dataset", "path"] in locs, resp.text
            assert client.get("/v1/jobs").json()["count"] == 0
    finally:
        backends.close()


# ---- downstream file sets -----------------------------------------------------------------------------------
def file_set(path: Path, **fields) -> dict:
    return {"task": "file", "name": "bench", "dataset": {"path": str(path), "prompt_field": "question",
                                                          "answer_field": "solution"}} | fields


def test_a_file_eval_set_is_every_record_of_its_file(tmp_path):
    bench = write_jsonl(tmp_path / "bench.jsonl", ROWS[:30])
    recipe = parse_recipe({"validation": {"eval_sets": [file_set(bench, num_prompts=25, verifier="exact_numeric")]}})
    (s,) = recipe.validation.eval_sets
    prompts = build_prompts(s.task_config(recipe.task.seed), eval_set_split(s.task))
    assert [(p.text, p.answer, p.task) for p in prompts] == [
        (r["question"], r["solution"], "exact_numeric") for r in ROWS[:25]]
    assert eval_set_split("arithmetic") == "validation"


@pytest.mark.parametrize("case, loc, message", [
    ("missing_file", ("validation", "eval_sets", 0, "dataset", "path"), "does not exist"),
    ("no_answer_field", ("validation", "eval_sets", 0, "dataset", "answer_field"), "'answer'"),
    ("no_dataset", ("validation", "eval_sets", 0), "needs a dataset"),
    ("no_name", ("validation", "eval_sets", 0), "needs a name"),
    ("dataset_on_arithmetic", ("validation", "eval_sets", 0), "only a file eval set reads a dataset"),
    ("wrong_verifier", ("validation", "eval_sets", 0, "verifier"), "cannot be graded by"),
    ("training_file", (), "the job trains on"),
])
def test_a_bad_file_eval_set_is_refused_naming_the_field(tmp_path, case, loc, message):
    bench = write_jsonl(tmp_path / "bench.jsonl", ROWS[:30])
    recipe: dict = {"validation": {"eval_sets": [file_set(bench)]}}
    es = recipe["validation"]["eval_sets"][0]
    if case == "missing_file":
        es["dataset"]["path"] = str(tmp_path / "nope.jsonl")
    elif case == "no_answer_field":
        es["dataset"]["answer_field"] = "answer"
    elif case == "no_dataset":
        del es["dataset"]
    elif case == "no_name":
        del es["name"]
    elif case == "dataset_on_arithmetic":
        es["task"] = "arithmetic"
    elif case == "wrong_verifier":
        es["task"], es["verifier"] = "arithmetic", "reasoning_gym"
        del es["dataset"]
    elif case == "training_file":
        recipe["task"] = {"name": "file", "dataset": dict(es["dataset"])}
    with pytest.raises(ValidationError) as info:
        parse_recipe(recipe)
    if loc:
        assert loc in error_locs(info.value), info.value
    assert message in str(info.value) and (case != "training_file" or "validation.eval_sets.0.dataset.path" in
                                           str(info.value))


# ---- reasoning-gym and math-verify --------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", ["gsm_symbolic", "basic_arithmetic", "chain_sum"])
def test_reasoning_gym_datasets_are_graded_by_their_own_scorer(dataset):
    cfg = TaskConfig(name=f"reasoning_gym/{dataset}", num_train_prompts=3, num_validation_prompts=2)
    train, val = build_prompts(cfg, "train"), build_prompts(cfg, "validation")
    assert len(train) == 3 and len(val) == 2
    assert {p.text for p in train}.isdisjoint({p.text for p in val})
    assert build_prompts(cfg, "train") == train  # deterministic
    for p in train:
        verifier = get_verifier(p.task)
        assert p.task == f"reasoning_gym/{dataset}"
        assert verifier(p.answer, p.answer, p.metadata) == 1.0
        assert verifier("no idea", p.answer, p.metadata) < 1.0


def test_math_verify_grades_boxed_answers():
    assert math_answer("17 + 25 = 42, so the answer is \\boxed{42}.", "42", {}) == 1.0
    assert math_answer("so the answer is \\boxed{32}.", "42", {}) == 0.0
    assert math_answer("<think>x</think> \\boxed{\\frac{1}{2}}", "0.5", {}) == 1.0
    assert math_answer("The answer is $\\boxed{3\\sqrt{2}}$", "\\sqrt{18}", {}) == 1.0


@pytest.mark.parametrize("response", ["16 + 44", "\\boxed{16+44}", "2*30", "$16 + 44$"])
def test_math_verify_refuses_an_expression_for_a_numeric_answer(response):
    """SmolLM2 under RL learned to restate the question ("16 + 44" for 60), which math-verify evaluates and
    scored 1: a numeric reference wants the value."""
    assert math_answer(response, "60", {}) == 0.0


@pytest.mark.parametrize(("response", "answer"), [
    ("16 + 44 = \\boxed{60}", "60"), ("\\boxed{60.0}", "60"),
    ("\\boxed{x^2 + 1}", "1 + x^2"),  # symbolic references keep equivalence
    # the working, then the value: math-verify reads an equation's right side
    ("$16 + 44 = 60$", "60"), ("\\boxed{x = 60}", "60"),
    ("1/2", "0.5"), ("-1/2", "-0.5"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{50\\%}", "50"),
    ("\\boxed{-5}", "-5")])
def test_math_verify_takes_a_number_in_any_written_form(response, answer):
    """The guard against restated questions must not refuse a value written as an equation's result, a
    fraction or a percentage (each scored 1 by math-verify before the guard)."""
    assert math_answer(response, answer, {}) == 1.0


@pytest.mark.parametrize("response", ["$x = 16 + 44$", "$16 + 44 = 16 + 44$", "\\boxed{60/1 + 0}", "2*30/1"])
def test_math_verify_refuses_an_expression_behind_an_equation_or_a_fraction(response):
    assert math_answer(response, "60", {}) == 0.0


# ---- chat templates -----------------------------------------------------------------------------------------
CHAT = ("{% for m in messages %}<s>{{ m['role'] }}:{{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant:{% endif %}")


@pytest.fixture(scope="module")
def chat_tokenizer():
    from scalerl.models import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = CHAT
    return tok


def test_prompts_are_rendered_with_the_models_chat_template(chat_tokenizer):
    cfg = PromptConfig(system_prompt="Be brief.")
    text = render_text(chat_tokenizer, "2+3=", cfg)
    assert text == "<s>system:Be brief.</s><s>user:2+3=</s><s>assistant:"
    ids = prompt_token_ids(chat_tokenizer, "2+3=", cfg)
    expected = chat_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="}],
        add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids == list(expected)
    assert ids.count(chat_tokenizer.bos_token_id) == 3  # the template's own, no extra BOS added on top


def test_generation_stops_at_the_templates_end_of_turn(chat_tokenizer):
    eos = chat_tokenizer.eos_token_id
    assert end_of_turn_token_ids(chat_tokenizer) == [eos]
    assert stop_token_ids(chat_tokenizer, PromptConfig()) == [eos]


def test_a_model_without_template_gets_plain_text():
    from scalerl.models import build_tokenizer

    tok = build_tokenizer()  # the tiny model's: no chat template
    assert prompt_token_ids(tok, "2+3=", PromptConfig()) == tok("2+3=")["input_ids"]  # BOS + characters
    assert end_of_turn_token_ids(tok) == []


def test_chat_template_none_keeps_the_text(chat_tokenizer):
    assert prompt_token_ids(chat_tokenizer, "2+3=", PromptConfig(chat_template="none")) == \
        chat_tokenizer("2+3=")["input_ids"]


# ---- interruption that can fire -----------------------------------------------------------------------------
def test_budgets_that_cannot_fit_max_model_len_are_refused():
    with pytest.raises(ValidationError) as info:
        parse_recipe({"model": {"max_model_len": 64}, "generation": {
            "forced_interruption": True, "thinking_budget_low": 24, "thinking_budget_high": 32,
            "solution_budget": 8}})  # the old demo: its 81-character phrase alone leaves no room
    message = str(info.value)
    for name in ("generation.thinking_budget_high", "generation.interruption_phrase",
                 "generation.solution_budget", "model.max_model_len"):
        assert name in message
    fits = {"forced_interruption": True, "thinking_budget_low": 6, "thinking_budget_high": 8,
            "solution_budget": 8, "interruption_phrase": " </think>"}
    assert parse_recipe({"model": {"max_model_len": 64}, "generation": fits}).generation.forced_interruption
    too_long = fits | {"solution_budget": 64 - 8 - 9}  # 8 + 9 + 47 + 1 prompt token = 65
    with pytest.raises(ValidationError, match="does not fit model.max_model_len"):
        parse_recipe({"model": {"max_model_len": 64}, "generation": too_long})


def test_phrase_bound_is_exact_for_the_tiny_model_and_bytes_otherwise():
    from scalerl.models import build_tokenizer

    phrase = Recipe().generation.interruption_phrase
    tok = build_tokenizer()
    assert phrase_token_bound(phrase, "builtin:tiny-arithmetic") == len(tok(phrase, add_special_tokens=False)
                                                                        ["input_ids"])
    assert phrase_token_bound("é</think>", "/models/other") == 11


CURVE_RECIPE = "bench/recipes/smollm2-sums.yaml"


def load_recipe_yaml(name: str, tmp_path: Path, monkeypatch) -> dict:
    """A shipped recipe's YAML; the real-model curve's dataset is written by its bench script first (a fresh clone
    has no var/), in a working directory where the recipe's relative path resolves."""
    data = yaml.safe_load((ROOT / name).read_text())
    if name == CURVE_RECIPE:
        out = data["recipe"]["task"]["dataset"]["path"]
        subprocess.run([sys.executable, str(ROOT / "bench/two_digit_sums.py"), out], cwd=tmp_path, check=True,
                       capture_output=True)
        monkeypatch.chdir(tmp_path)
    return data


@pytest.mark.parametrize("name", ["recipes/demo.yaml", "recipes/smollm2.yaml", CURVE_RECIPE])
def test_shipped_recipes_interrupt(name, tmp_path, monkeypatch):
    data = load_recipe_yaml(name, tmp_path, monkeypatch)
    recipe = parse_recipe(data["recipe"])
    g = recipe.generation
    assert g.forced_interruption
    assert g.thinking_budget_high + phrase_token_bound(g.interruption_phrase, recipe.model.path) \
        + g.solution_budget < recipe.model.max_model_len


def test_the_curve_validation_questions_are_not_trained_on(tmp_path, monkeypatch):
    task = parse_recipe(load_recipe_yaml(CURVE_RECIPE, tmp_path, monkeypatch)["recipe"]).task
    trained = {p.text for p in build_prompts(task, "train")}
    held_out = [p.text for p in build_prompts(task, "validation")]
    assert len(held_out) == task.num_validation_prompts and not trained.intersection(held_out)


def test_builtin_models_are_named_in_the_error(tmp_path):
    from scalerl.models import resolve_model_path

    with pytest.raises(ValueError, match="smollm2-135m-instruct, tiny-arithmetic"):
        resolve_model_path("builtin:gpt-5", tmp_path)


def test_a_stored_recipe_is_not_rechecked_against_the_file(tmp_path):
    """Services re-read the recipe from its JSON and may not see the file (learner, forecaster)."""
    data = write_jsonl(tmp_path / "d.jsonl", ROWS)
    stored = parse_recipe({"task": {"name": "file", "dataset": {"path": str(data), "prompt_field": "question",
                                                                 "answer_field": "solution"}}}).model_dump_json()
    data.unlink()
    assert parse_recipe(stored).task.dataset.path == str(data)
    with pytest.raises(ValidationError):
        parse_recipe(json.loads(stored))
