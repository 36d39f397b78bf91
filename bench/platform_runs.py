"""Runs of the whole platform on this machine (the local stack, as `make run` starts it): the demo recipe with
several seeds, recipe ablations, and the single-process synchronous loop on the same recipe for comparison.
Writes each run's curve (CSV + PNG), fits the sigmoid on the whole run and on its first half, and prints a
markdown report.

    python bench/platform_runs.py --seeds 0 1 --ablation grpo --sync-loop --target 0.5 --out docs/benchmarks/runs
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

ABLATIONS = {
    # GRPO-style: PPO clip 0.2, sample-average aggregation, prompt-level advantage normalisation.
    "grpo": {"loss": {"type": "grpo", "clip_low": 0.2, "aggregation": "sample", "advantage_norm": "prompt"}},
    "dapo": {"loss": {"type": "dapo", "clip_low": 0.2, "clip_high": 0.28, "aggregation": "token"}},
}


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def run_job(api: httpx.Client, name: str, recipe: dict, supervise=lambda: None,
            poll_s: float = 0.5) -> tuple[dict, list[dict]]:
    """Run one job to the end. Each validation point gets wall_s: seconds from submission until the learner
    first reported the step that point validates (the time the evaluated weights existed, polled every
    poll_s), so the evaluator's latency does not count against the platform. `supervise` runs every poll: the
    stack's restart of crashed services, as `scalerl up` does (without it a crashed learner stalls the job)."""
    job = api.post("/v1/jobs", json={"recipe": recipe, "name": name}).raise_for_status().json()
    started = time.monotonic()
    step_seen: dict[int, float] = {0: 0.0}
    while True:
        job = api.get(f"/v1/jobs/{job['id']}").json()
        step_seen.setdefault(job["step"], time.monotonic() - started)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            break
        supervise()
        time.sleep(poll_s)
    points = api.get(f"/v1/jobs/{job['id']}/curve").json()["points"]
    seen_steps = sorted(step_seen)
    for p in points:
        # The first poll that showed this step or a later one.
        at = next((s for s in seen_steps if s >= p["step"]), seen_steps[-1])
        p["wall_s"] = round(step_seen[at], 1)
    first_step = min((t for st, t in step_seen.items() if st >= 1), default=0.0)
    job["first_step_s"] = round(first_step, 1)
    print(f"# {name}: {job['state']} step {job['step']} in {time.monotonic() - started:.0f}s "
          f"(first step at {first_step:.1f}s)", flush=True)
    return job, points


def write_csv(path: Path, points: list[dict]) -> None:
    keys = ["step", "policy_version", "compute", "value", "wall_s", "generated_tokens", "learner_device_hours",
            "generator_device_hours"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(points)


def fits(points: list[dict], png: Path, title: str) -> dict:
    from scalerl_forecaster.fit import fit_curve, halfway_check
    from scalerl_forecaster.plot import plot_fit

    c = [p["compute"] for p in points]
    v = [p["value"] for p in points]
    full = fit_curve(c, v, min_compute=0.0, predict_at=[c[-1]])
    plot_fit(full, png, title=title)
    check = halfway_check(c, v)
    out = {"A": full.params["A"], "B": full.params["B"], "C_mid": full.params["C_mid"], "R0": full.params["R0"],
           "A_iv": full.intervals.get("A"), "identifiable": full.identifiable,
           "final": sum(v[-3:]) / len(v[-3:]), "half_points": sum(1 for x in c if 0 < x <= c[-1] / 2)}
    if check is None:  # too short a run to fit its first half
        return out
    plot_fit(check.fit, png.with_name(png.stem + "_half.png"), extend_to=c[-1], title=title + " (fit on first half)")
    pred = check.predicted
    return out | {"half_pred": pred.value, "half_iv": pred.interval, "half_err": check.error,
                  "half_A": check.fit.params["A"], "half_identifiable": check.fit.identifiable}


def safe_fits(points: list[dict], png: Path, title: str) -> dict | None:
    """fits(), or None for a curve too short to fit (a cancelled run keeps its CSV and the report)."""
    from scalerl_forecaster.fit import CurveError

    try:
        return fits(points, png, title)
    except CurveError as err:
        print(f"# {title}: no fit ({err})", flush=True)
        return None


def time_to(points: list[dict], target: float, window: int = 1) -> dict | None:
    """The first validation point at which the mean of the last `window` points reaches `target` (the loop is
    stopped by the same rule, so validation noise neither side can control cancels out of the ratio)."""
    for i in range(window - 1, len(points)):
        if sum(p["value"] for p in points[i - window + 1:i + 1]) / window >= target:
            p = points[i]
            return {"wall_s": p["wall_s"], "tokens": p["generated_tokens"], "step": p["step"]}
    return None


def sync_loop(recipe: dict, seed: int, target: float, window: int, model_dir: Path, max_seconds: float,
              engine: str, out_csv: Path) -> dict:
    """bench/sync_loop.py on the recipe's model, task, batch, lr, validation and step budget, to the target."""
    from scalerl.recipe import parse_recipe

    pipe, val, opt, task = recipe["pipeline"], recipe["validation"], recipe["optimizer"], recipe.get("task", {})
    gen = parse_recipe(recipe).generation  # the platform's token budget per completion, defaults included
    cmd = [sys.executable, str(ROOT / "bench/sync_loop.py"), "--engine", engine, "--model-dir", str(model_dir),
           "--seed", str(seed), "--prompts-per-batch", str(pipe["prompts_per_batch"]),
           "--generations", str(pipe["generations_per_prompt"]), "--lr", str(opt["lr"]),
           "--warmup", str(opt.get("warmup_steps", 0)), "--eval-every", str(val["every_steps"]),
           "--eval-prompts", str(val["num_prompts"]), "--eval-samples", str(val["samples_per_prompt"]),
           "--target", str(target), "--target-window", str(window), "--max-seconds", str(max_seconds),
           "--max-new-tokens", str(gen.thinking_budget_high + gen.solution_budget),
           "--steps", str(recipe["budget"]["max_steps"]), "--out", str(out_csv)]
    if "difficulty" in task:
        cmd += ["--difficulty", json.dumps(task["difficulty"])]
    if "no_positive_resampling_threshold" in recipe.get("data", {}):
        threshold = recipe["data"]["no_positive_resampling_threshold"]
        cmd += ["--npr", "off" if threshold is None else str(threshold)]
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"}).stdout
    wall = time.monotonic() - started
    startup = re.search(r"startup_seconds=([\d.]+)", out)
    m = re.search(r"target \S+ reached at step (\d+): ([\d.]+)s, (\d+) generated tokens, "
                  r"([\d.]+)s of validation", out)
    if not m:
        return {"engine": engine, "reached": False, "wall_s": wall, "log_tail": out.splitlines()[-3:]}
    return {"engine": engine, "reached": True, "step": int(m.group(1)), "train_s": float(m.group(2)),
            "tokens": int(m.group(3)), "validation_s": float(m.group(4)), "wall_s": wall,
            "startup_s": float(startup.group(1)) if startup else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=ROOT / "recipes/demo.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--ablation", choices=sorted(ABLATIONS), nargs="*", default=[])
    ap.add_argument("--sync-loop", nargs="*", choices=["vllm", "hf"], default=None,
                    help="also run bench/sync_loop.py to the target with these engines (default: vllm hf)")
    ap.add_argument("--target", type=float, default=0.5)
    ap.add_argument("--target-window", type=int, default=3,
                    help="reached when the mean of this many consecutive validation points reaches the target")
    ap.add_argument("--max-steps", type=int, default=None, help="override the recipe's budget.max_steps")
    ap.add_argument("--out", type=Path, default=ROOT / "var/bench_runs")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "var/bench_stack")
    args = ap.parse_args()
    from scalerl_stack.supervisor import Stack
    from scalerl.models import resolve_model_path

    args.out.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(args.recipe.read_text())
    base = base.get("recipe", base)
    if args.max_steps:
        base = merge(base, {"budget": {"max_steps": args.max_steps}})
    runs = [(f"scalerl-seed{s}", merge(base, {"seed": s})) for s in args.seeds]
    runs += [(f"{a}-seed{args.seeds[0]}", merge(base, ABLATIONS[a] | {"seed": args.seeds[0]})) for a in args.ablation]
    model_dir = resolve_model_path(base.get("model", {}).get("path", "builtin:tiny-arithmetic"), args.data_dir)
    os.environ.pop("REDIS_URL", None)
    stack = Stack(args.data_dir, generators=1)
    stack.start()
    results = {}
    try:
        if not stack.wait_serving(600):
            raise SystemExit(f"stack not SERVING: {stack.health()}")
        with httpx.Client(base_url=f"http://127.0.0.1:{stack.http_port}", timeout=30,
                          headers={"Authorization": f"Bearer {os.environ.get('SCALERL_API_TOKEN', 'scalerl-dev-token')}"}) as api:
            for name, recipe in runs:
                job, points = run_job(api, name, recipe, supervise=stack.poll)
                write_csv(args.out / f"{name}.csv", points)
                results[name] = {"job": job["id"], "state": job["state"], "points": points,
                                 "fit": safe_fits(points, args.out / f"{name}.png", name),
                                 "to_target": time_to(points, args.target, args.target_window),
                                 "first_step_s": job["first_step_s"]}
    finally:
        stack.stop()
    if args.sync_loop is not None:
        longest = max((r["points"][-1]["wall_s"] for r in results.values() if r["points"]), default=900)
        for engine in args.sync_loop or ["vllm", "hf"]:
            for seed in args.seeds:
                name = f"sync-loop-{engine}-seed{seed}"
                results[name] = sync_loop(base | {"seed": seed}, seed, args.target, args.target_window, model_dir,
                                          max(600, longest), engine, args.out / f"{name}.csv")
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(report(results, args.target, args.target_window))


def report(results: dict, target: float, window: int = 1) -> str:
    lines = ["| run | final pass rate | A [80% interval] | B | C_mid (device-h) | R0 | first-half fit predicts final "
             "| error |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        f = r.get("fit") if isinstance(r, dict) else None
        if not f:
            continue
        iv = f["A_iv"]
        half = (f"{f['half_pred']:.3f} [{f['half_iv'][0]:.3f}, {f['half_iv'][1]:.3f}] ({f['half_points']} pts) | "
                f"{f['half_err']:+.3f}") if "half_pred" in f else f"too few points ({f['half_points']}) | –"
        lines.append(f"| {name} | {f['final']:.3f} | {f['A']:.3f} [{iv[0]:.3f}, {iv[1]:.3f}] | {f['B']:.2f} | "
                     f"{f['C_mid']:.4g} | {f['R0']:.3f} | {half} |")
    lines += ["", f"Time to validation pass rate ≥ {target} as the mean of {window} consecutive points (platform: "
              "from submission / from its first step, its "
              "evaluator validating beside it; loop: training + generation + weight loads / the same plus the "
              "validations it stopped for before the target, start-up excluded):", "",
              "| run | wall s | generated tokens | step | s per step |", "|---|---|---|---|---|"]
    for name, r in results.items():
        if name.startswith("sync-loop"):
            label = {"vllm": "sync loop, vLLM in-process", "hf": "sync loop, HF generate"}[r["engine"]]
            label += f" ({name.rsplit('-', 1)[-1]})"
            if r.get("reached"):
                lines.append(f"| {label} | {r['train_s']} / {r['train_s'] + r['validation_s']:.1f} (start-up "
                             f"{r.get('startup_s')}) | {r['tokens']} | {r['step']} | {r['train_s'] / r['step']:.3f} |")
            else:
                lines.append(f"| {label} | not reached | | | |")
        elif r.get("to_target"):
            t = r["to_target"]
            per_step = (t["wall_s"] - r["first_step_s"]) / max(t["step"] - 1, 1)
            lines.append(f"| {name} (platform) | {t['wall_s']} / {t['wall_s'] - r['first_step_s']:.1f} | "
                         f"{t['tokens']} | {t['step']} | {per_step:.3f} |")
        else:
            lines.append(f"| {name} (platform) | not reached | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
