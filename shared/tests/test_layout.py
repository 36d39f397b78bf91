"""The package layout, checked on the source: layers shared < services < stack, and no import cycle anywhere.

Every import statement of every package module is read from the AST (module-level and function-level,
`import x` and `from x import y`, relative imports resolved), so an import hidden in a function counts too.
`if TYPE_CHECKING:` imports count for the layers but not for cycles (they never run). bench/, e2e_tests/ and
the tests folders are not packages and may import anything. `python shared/tests/test_layout.py` prints the table.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY_PREFIX = "scalerl"
"""Every top-level name of this repository starts with it; one that no package provides is a broken import."""


@dataclass(frozen=True)
class Package:
    dist: str
    folder: Path
    """The package's project folder (where its pyproject.toml is)."""
    top: str
    """The import name of its one top-level package."""
    layer: str
    """"shared", "service" or "stack": shared < service < stack."""


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    importer: str
    """The module that holds the statement."""
    target: str
    """The module imported, absolute; for `from X import y`, X.y when that is a module, else X."""
    type_only: bool
    """Under `if TYPE_CHECKING:`: never runs."""
    function_level: bool

    def where(self, root: Path = ROOT) -> str:
        return f"{self.path.relative_to(root)}:{self.line}"


def discover_packages(root: Path = ROOT) -> list[Package]:
    packages = [Package("scalerl-shared", root / "shared", "scalerl", "shared")]
    for folder in sorted((root / "services").iterdir()):
        if (folder / "pyproject.toml").exists():
            packages.append(Package(f"scalerl-{folder.name}", folder,
                                    "scalerl_" + folder.name.replace("-", "_"), "service"))
    packages.append(Package("scalerl-stack", root / "stack", "scalerl_stack", "stack"))
    return packages


def package_modules(package: Package) -> dict[str, Path]:
    """Module name -> file, for every .py under the package's top-level package (generated stubs included)."""
    modules = {}
    for path in sorted((package.folder / package.top).rglob("*.py")):
        parts = list(path.relative_to(package.folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_imports(path: Path, module: str, known_modules: set[str]) -> Iterator[Import]:
    """Every import statement of one file, resolved to absolute module names."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]

    def visit(node: ast.AST, type_only: bool, in_function: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, module, alias.name, type_only, in_function)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if node.level - 1 > len(package):
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the top-level package")
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                target = submodule if submodule in known_modules else base
                yield Import(path, node.lineno, module, target, type_only, in_function)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True, in_function)
            for child in node.orelse:
                yield from visit(child, type_only, in_function)
            return
        in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, type_only, in_function)

    seen = set()
    for imp in visit(tree, False, False):
        if imp not in seen:  # `from x import a, b` is one edge
            seen.add(imp)
            yield imp


@dataclass
class Tree:
    packages: list[Package]
    modules: dict[str, tuple[Package, Path]]
    imports: list[Import]

    def package_of(self, target: str) -> Package | None:
        top = target.split(".")[0]
        return next((p for p in self.packages if p.top == top), None)

    def resolve(self, target: str) -> str | None:
        """The first-party module `target` names (itself or the longest enclosing module), None if none."""
        parts = target.split(".")
        while parts:
            if ".".join(parts) in self.modules:
                return ".".join(parts)
            parts.pop()
        return None


def scan(root: Path = ROOT) -> Tree:
    packages = discover_packages(root)
    modules = {name: (p, path) for p in packages for name, path in package_modules(p).items()}
    imports = [imp for name, (_, path) in modules.items() for imp in module_imports(path, name, set(modules))]
    return Tree(packages, modules, imports)


def layer_violations(tree: Tree) -> list[str]:
    """Upward imports: shared importing a service or the stack, a service importing another service or the stack."""
    found = []
    for imp in tree.imports:
        source, target = tree.modules[imp.importer][0], tree.package_of(imp.target)
        if target is None or target is source:
            continue
        upward = (source.layer == "shared" and target.layer != "shared") or (
            source.layer == "service" and target.layer in ("service", "stack"))
        if upward:
            found.append(f"{imp.where(tree.packages[0].folder.parent)} ({source.layer} {source.dist}) imports "
                         f"{imp.target} ({target.layer} {target.dist})")
    return sorted(found)


def unresolved_imports(tree: Tree) -> list[str]:
    """First-party imports (scalerl*) that name no module of any package: a renamed or missing package."""
    root = tree.packages[0].folder.parent
    return [f"{imp.where(root)} imports {imp.target}: no package here provides it"
            for imp in tree.imports
            if imp.target.split(".")[0].startswith(FIRST_PARTY_PREFIX) and tree.resolve(imp.target) is None]


def module_graph(tree: Tree) -> dict[str, dict[str, Import]]:
    """importer -> {imported first-party module: first statement}, for imports that run."""
    graph: dict[str, dict[str, Import]] = {name: {} for name in tree.modules}
    for imp in tree.imports:
        target = tree.resolve(imp.target)
        if target is not None and not imp.type_only:
            graph[imp.importer].setdefault(target, imp)
    return graph


def strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's components with a cycle in them (more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0

    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))
    return components


def shortest_cycle(graph: dict[str, dict[str, Import]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module, as [a, b, ..., a]."""
    start, members = component[0], set(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child in members and child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError("a strongly connected component has a cycle")


def cycles(tree: Tree) -> list[str]:
    graph, root = module_graph(tree), tree.packages[0].folder.parent
    reports = []
    for component in strongly_connected(graph):
        cycle = shortest_cycle(graph, component)
        steps = "\n".join(f"    {graph[a][b].where(root)}: {a} imports {b}" for a, b in zip(cycle, cycle[1:]))
        reports.append(f"import cycle among {', '.join(component)}: {' -> '.join(cycle)}\n{steps}")
    return reports


def _fail(title: str, found: list[str]) -> None:
    assert not found, f"{title} ({len(found)}):\n" + "\n".join(found)


def test_shared_and_services_import_nothing_above_them():
    _fail("upward imports (shared < services < stack)", layer_violations(scan()))


def test_first_party_imports_resolve():
    _fail("imports of first-party modules that do not exist", unresolved_imports(scan()))


def test_no_import_cycles():
    _fail("import cycles", cycles(scan()))


def test_folder_and_package_names_agree():
    found = []
    for package in discover_packages():
        if not (package.folder / package.top / "__init__.py").exists():
            found.append(f"{package.folder.relative_to(ROOT)} has no package {package.top}/")
        pyproject = (package.folder / "pyproject.toml").read_text()
        if f'name = "{package.dist}"' not in pyproject:
            found.append(f"{package.folder.relative_to(ROOT)}/pyproject.toml does not name {package.dist}")
    _fail("folder, distribution and package names disagree", found)


# The checks themselves, on a small tree written here, so each can be seen to fail.
def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _small_tree(root: Path, files: dict[str, str]) -> Tree:
    base = {"shared/pyproject.toml": 'name = "scalerl-shared"', "shared/scalerl/__init__.py": "",
            "services/api/pyproject.toml": 'name = "scalerl-api"', "services/api/scalerl_api/__init__.py": "",
            "services/learner/pyproject.toml": 'name = "scalerl-learner"',
            "services/learner/scalerl_learner/__init__.py": "",
            "stack/pyproject.toml": 'name = "scalerl-stack"', "stack/scalerl_stack/__init__.py": ""}
    _write(root, {**base, **files})
    return scan(root)


def test_layer_check_reports_upward_imports_with_file_and_line(tmp_path):
    tree = _small_tree(tmp_path, {
        "shared/scalerl/cli.py": "import os\n\ndef run():\n    from scalerl_stack import supervisor\n",
        "shared/scalerl/v1/api_pb2.py": "import scalerl_api\n",
        "services/api/scalerl_api/main.py": "from scalerl_learner import x\nfrom scalerl import cli\n",
        "stack/scalerl_stack/supervisor.py": "import scalerl_api.main\nimport scalerl_learner\n",
    })
    found = layer_violations(tree)
    assert found == [
        "services/api/scalerl_api/main.py:1 (service scalerl-api) imports scalerl_learner (service scalerl-learner)",
        "shared/scalerl/cli.py:4 (shared scalerl-shared) imports scalerl_stack.supervisor (stack scalerl-stack)",
        "shared/scalerl/v1/api_pb2.py:1 (shared scalerl-shared) imports scalerl_api (service scalerl-api)",
    ]


def test_cycle_check_finds_cycles_through_relative_and_function_level_imports(tmp_path):
    tree = _small_tree(tmp_path, {
        "shared/scalerl/weights/__init__.py": "",
        "shared/scalerl/weights/base.py": "def make():\n    from . import grpc\n",
        "shared/scalerl/weights/grpc.py": "from .base import make\n",
        "shared/scalerl/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from scalerl import plain\n",
        "shared/scalerl/plain.py": "import scalerl.typed\n",
        "stack/scalerl_stack/cli.py": "from scalerl_stack.demo import run\n",
        "stack/scalerl_stack/demo.py": "from .cli import app\n",
    })
    assert cycles(tree) == [
        "import cycle among scalerl.weights.base, scalerl.weights.grpc: "
        "scalerl.weights.base -> scalerl.weights.grpc -> scalerl.weights.base\n"
        "    shared/scalerl/weights/base.py:2: scalerl.weights.base imports scalerl.weights.grpc\n"
        "    shared/scalerl/weights/grpc.py:1: scalerl.weights.grpc imports scalerl.weights.base",
        "import cycle among scalerl_stack.cli, scalerl_stack.demo: scalerl_stack.cli -> scalerl_stack.demo -> "
        "scalerl_stack.cli\n"
        "    stack/scalerl_stack/cli.py:1: scalerl_stack.cli imports scalerl_stack.demo\n"
        "    stack/scalerl_stack/demo.py:1: scalerl_stack.demo imports scalerl_stack.cli",
    ]


def test_unresolved_check_names_a_renamed_package(tmp_path):
    tree = _small_tree(tmp_path, {"services/learner/scalerl_learner/runner.py":
                                  "from scalerl_weights.transport import make_transport\n"})
    assert unresolved_imports(tree) == [
        "services/learner/scalerl_learner/runner.py:1 imports scalerl_weights.transport: no package here provides it"]


if __name__ == "__main__":
    scanned = scan()
    for imp in sorted(scanned.imports, key=lambda i: (str(i.path), i.line)):
        flags = "".join([" (function)" if imp.function_level else "", " (TYPE_CHECKING)" if imp.type_only else ""])
        print(f"{imp.where()} imports {imp.target}{flags}")
    problems = layer_violations(scanned) + unresolved_imports(scanned) + cycles(scanned)
    print("\n".join(problems) or "layout ok")
    sys.exit(1 if problems else 0)
