"""The package's layers, checked from the source (DESIGN §5).

``coordinator/`` has a folder per layer and imports point only downward::

    server ──> raft ──> core        server ──> client ──> core        (api: generated, leaf)

- only ``coordinator/raft/`` imports pysyncobj;
- ``core/`` imports nothing that does I/O or reads a clock or randomness: an allow-list of
  pure standard-library modules and msgpack, and nothing from another layer;
- a lower layer never imports a higher one, and ``raft`` and ``client`` never import each other;
- nothing under ``coordinator/`` imports the test harness (``testsupport``, ``tests``,
  ``chaos``, ``bench``), which is not shipped.
- every layer's ``__init__`` docstring maps its modules (a ``Modules`` block, one line per
  module, subpackages' modules dotted: ``v1.fencing_pb2``), and the map names exactly the
  ``.py`` files present: no module missing from it, no name in it without a file.

Imports are read from the AST, anywhere in a module (inside functions and try blocks too), so
a lazy import cannot slip past. The checker's own tests below build small trees that break each
rule and show that it reports them.
"""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap

import pytest

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent / "coordinator"

# A layer may import the layers named here (and itself). Anything else inside coordinator
# is an upward or sideways arrow.
ALLOWED_LAYERS: dict[str, set[str]] = {
    "core": set(),
    "api": set(),
    "raft": {"core"},
    "client": {"core", "api"},
    "server": {"core", "api", "raft", "client"},
    "": {"core", "api", "raft", "client", "server"},  # the package's own __init__
}

# What core may import from outside: pure computation only. No os, io, socket, time, random,
# threading, logging, grpc or pysyncobj -- time arrives inside each command.
CORE_ALLOWED_OUTSIDE = {
    "__future__", "abc", "bisect", "collections", "dataclasses", "enum", "functools", "hashlib",
    "heapq", "itertools", "math", "msgpack", "operator", "re", "struct", "typing",
}
# Single pure functions of an otherwise impure module, imported by name (``from sys import
# intern``): the state machine interns repeated labels (core/state.py ``shared``).
CORE_ALLOWED_NAMES = {"sys.intern"}

HARNESS_PACKAGES = {"testsupport", "tests", "chaos", "bench"}


def _layer_of(module: str) -> str:
    """``coordinator.raft.node`` -> ``raft``; ``coordinator`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(package_dir: pathlib.Path, path: pathlib.Path) -> str:
    rel = path.relative_to(package_dir).with_suffix("")
    parts = [package_dir.name, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(package_dir: pathlib.Path, path: pathlib.Path) -> set[str]:
    """Every module name ``path`` imports, absolute, anywhere in its source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(package_dir, path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")
                drop = node.level - (1 if is_package else 0)
                base_parts = base_parts[: len(base_parts) - drop] if drop else base_parts
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not all(f"{base}.{alias.name}" in CORE_ALLOWED_NAMES for alias in node.names):
                found.add(base)
            for alias in node.names:  # `from coordinator.core import limits` names a module
                found.add(f"{base}.{alias.name}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            found.add("__import__")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            found.add("importlib")
    return found


def violations(package_dir: pathlib.Path) -> list[str]:
    """Every broken layering rule in the package at ``package_dir``, one line each."""
    root = package_dir.name
    found: list[str] = []
    for path in sorted(package_dir.rglob("*.py")):
        module = _module_name(package_dir, path)
        layer = _layer_of(module)
        for name in sorted(imports_of(package_dir, path)):
            top = name.split(".")[0]
            if top == "pysyncobj" and layer != "raft":
                found.append(f"{module} imports pysyncobj outside {root}/raft/")
            elif top in HARNESS_PACKAGES:
                found.append(f"{module} imports the test harness {name}")
            elif top == root:
                target = _layer_of(name)
                if target and target != layer and target not in ALLOWED_LAYERS.get(layer, set()):
                    found.append(f"{module} ({layer}) imports {name} ({target})")
            elif layer == "core" and top not in CORE_ALLOWED_OUTSIDE and name not in CORE_ALLOWED_NAMES:
                found.append(f"{module} (core) imports {top}, which is not pure")
    return sorted(set(found))


def test_the_package_keeps_its_layers():
    assert violations(PACKAGE_DIR) == []


def test_every_layer_folder_exists_and_nothing_sits_beside_them():
    layers = {p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert layers == {"core", "raft", "server", "client", "api"}
    loose = sorted(p.name for p in PACKAGE_DIR.glob("*.py"))
    assert loose == ["__init__.py"]


def test_only_raft_imports_pysyncobj_and_it_does():
    """The rule above is not vacuous: raft really is where pysyncobj comes in."""
    importers = {
        _module_name(PACKAGE_DIR, p)
        for p in PACKAGE_DIR.rglob("*.py")
        if any(n.split(".")[0] == "pysyncobj" for n in imports_of(PACKAGE_DIR, p))
    }
    assert importers and all(m.startswith("coordinator.raft.") for m in importers)


LAYER_PACKAGES = ("core", "raft", "server", "client", "api")
# The map's header line, then one line per module: four spaces, the name, two spaces or more,
# what it does; deeper-indented lines continue the description. A blank line or text at the
# docstring's own indentation ends the map.
MAP_HEADER = re.compile(r"^Modules\b.*:\s*$")
MAP_LINE = re.compile(r"^ {4}(?P<name>[A-Za-z_][\w.]*)(?: {2,}\S.*)?$")
MAP_CONTINUATION = re.compile(r"^ {5,}\S")


def module_map(init: pathlib.Path) -> list[str] | None:
    """The module names the ``Modules`` block of ``init``'s docstring lists, in order; None if
    it has no such block."""
    doc = ast.get_docstring(ast.parse(init.read_text()), clean=True) or ""
    lines = doc.splitlines()
    starts = [i for i, line in enumerate(lines) if MAP_HEADER.match(line)]
    if not starts:
        return None
    names: list[str] = []
    for line in lines[starts[0] + 1:]:
        if not line.strip():
            if names:
                break
            continue
        entry = MAP_LINE.match(line)
        if entry:
            names.append(entry.group("name"))
        elif not (names and MAP_CONTINUATION.match(line)):
            break
    return names


def modules_of(package: pathlib.Path) -> set[str]:
    """Every module under ``package`` (``__init__`` files aside), dotted from it."""
    return {
        ".".join(path.relative_to(package).with_suffix("").parts)
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }


def map_problems(package_dir: pathlib.Path, packages=LAYER_PACKAGES) -> list[str]:
    """One line per module missing from its package's map, per name in a map without a file,
    per name listed twice, and per package without a map."""
    root = package_dir.name
    found: list[str] = []
    for name in packages:
        package = package_dir / name
        init = package / "__init__.py"
        listed = module_map(init)
        if listed is None:
            found.append(f"{root}/{name}/__init__.py has no module map (a 'Modules ...:' block in its docstring)")
            continue
        present = modules_of(package)
        for module in sorted(present - set(listed)):
            found.append(
                f"{root}/{name}/{module.replace('.', '/')}.py is missing from the module map"
                f" in {root}/{name}/__init__.py"
            )
        for module in sorted(set(listed) - present):
            found.append(
                f"the module map in {root}/{name}/__init__.py names {module},"
                f" but {root}/{name}/{module.replace('.', '/')}.py does not exist"
            )
        for module in sorted({m for m in listed if listed.count(m) > 1}):
            found.append(f"the module map in {root}/{name}/__init__.py names {module} twice")
    return found


def test_every_layer_maps_exactly_its_modules():
    assert map_problems(PACKAGE_DIR) == []


def test_the_maps_are_not_empty():
    """Not vacuous: each map was found and lists modules."""
    for name in LAYER_PACKAGES:
        assert module_map(PACKAGE_DIR / name / "__init__.py"), name


def test_only_the_raft_package_names_the_raft_library():
    """Outside ``coordinator/raft/`` the library is "the Raft library": a module that needs its
    name (in code or in a comment about its internals) belongs in the Raft package."""
    naming = sorted(
        str(p.relative_to(PACKAGE_DIR.parent))
        for p in PACKAGE_DIR.rglob("*")
        if p.suffix in (".py", ".md") and "raft" not in p.relative_to(PACKAGE_DIR).parts[:1]
        and "pysyncobj" in p.read_text().lower()
    )
    assert naming == []


# -- the checker's own tests: each rule, broken once ----------------------------------------


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    pkg = tmp_path / "coordinator"
    for rel, source in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != pkg and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(textwrap.dedent(source))
    return pkg


def test_checker_passes_a_clean_tree(tmp_path):
    pkg = _tree(tmp_path, {
        "core/sm.py": "import msgpack\nfrom coordinator.core import limits\n",
        "core/limits.py": "X_MAX = 1\n",
        "raft/node.py": "import pysyncobj\nfrom coordinator.core import sm\n",
        "client/c.py": "import grpc\nfrom coordinator.core.limits import X_MAX\n",
        "server/s.py": "from coordinator.raft.node import x\nfrom coordinator.client import c\n",
    })
    assert violations(pkg) == []


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"server/s.py": "import pysyncobj\n"}, "coordinator.server.s imports pysyncobj outside coordinator/raft/"),
        ({"client/c.py": "def f():\n    from pysyncobj import SyncObj\n"},
         "coordinator.client.c imports pysyncobj outside coordinator/raft/"),
        ({"core/sm.py": "import time\n"}, "coordinator.core.sm (core) imports time, which is not pure"),
        ({"core/sm.py": "try:\n    import socket\nexcept ImportError:\n    pass\n"},
         "coordinator.core.sm (core) imports socket, which is not pure"),
        ({"core/sm.py": "__import__('os')\n"}, "coordinator.core.sm (core) imports __import__, which is not pure"),
        ({"core/sm.py": "from coordinator.raft import node\n"},
         "coordinator.core.sm (core) imports coordinator.raft (raft)"),
        ({"raft/node.py": "from coordinator.server.errors import X\n"},
         "coordinator.raft.node (raft) imports coordinator.server.errors (server)"),
        ({"raft/node.py": "from coordinator.client import exceptions\n"},
         "coordinator.raft.node (raft) imports coordinator.client (client)"),
        ({"client/c.py": "from coordinator.raft.node import RaftNode\n"},
         "coordinator.client.c (client) imports coordinator.raft.node (raft)"),
        ({"client/c.py": "from ..server import app\n"},
         "coordinator.client.c (client) imports coordinator.server (server)"),
        ({"server/s.py": "from testsupport.cluster import ProcessCluster\n"},
         "coordinator.server.s imports the test harness testsupport.cluster"),
        ({"core/sm.py": "import sys\n"}, "coordinator.core.sm (core) imports sys, which is not pure"),
        ({"core/sm.py": "from sys import intern, exit\n"}, "coordinator.core.sm (core) imports sys, which is not pure"),
    ],
)
def test_checker_reports_each_kind_of_violation(tmp_path, files, expected):
    assert expected in violations(_tree(tmp_path, files))


def test_checker_lets_core_import_only_the_named_pure_function_of_sys(tmp_path):
    assert violations(_tree(tmp_path, {"core/sm.py": "from sys import intern\n"})) == []


def _mapped_tree(tmp_path: pathlib.Path, doc: str, modules: list[str]) -> pathlib.Path:
    pkg = tmp_path / "coordinator"
    (pkg / "core").mkdir(parents=True)
    (pkg / "core" / "__init__.py").write_text(f'"""{doc}"""\n')
    for module in modules:
        path = pkg / "core" / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text("")
    return pkg


_MAP_DOC = """The core layer.

Owns: things.

Modules (one job each):

    limits      numbers
    commands    the command codec, described
                over two lines
    v1.gen      generated

Must never: do I/O.
"""


def test_map_checker_passes_a_matching_map(tmp_path):
    pkg = _mapped_tree(tmp_path, _MAP_DOC, ["limits", "commands", "v1.gen"])
    assert module_map(pkg / "core" / "__init__.py") == ["limits", "commands", "v1.gen"]
    assert map_problems(pkg, ("core",)) == []


def test_map_checker_names_the_module_missing_from_the_map_and_the_name_without_a_file(tmp_path):
    pkg = _mapped_tree(tmp_path, _MAP_DOC, ["limits", "v1.gen", "dedup"])
    assert map_problems(pkg, ("core",)) == [
        "coordinator/core/dedup.py is missing from the module map in coordinator/core/__init__.py",
        "the module map in coordinator/core/__init__.py names commands,"
        " but coordinator/core/commands.py does not exist",
    ]


def test_map_checker_reports_a_package_without_a_map(tmp_path):
    pkg = _mapped_tree(tmp_path, "The core layer, with no map.", ["limits"])
    assert map_problems(pkg, ("core",)) == [
        "coordinator/core/__init__.py has no module map (a 'Modules ...:' block in its docstring)"
    ]
