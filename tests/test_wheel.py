"""The built wheel ships the product and nothing else.

Builds the wheel from a copy of this checkout (offline: no index, no build isolation, the
venv's setuptools) and lists its files: every module under coordinator/ — the core, raft,
server and client layers and the generated API — and no test harness (testsupport/, tests/,
chaos/, bench/). The copy leaves out build/ and *.egg-info: setuptools reuses a stale build/lib,
which could put deleted modules into the wheel, and the checkout stays untouched.

Then installs it as a user would, offline: into a fresh venv, with exactly the distributions
its metadata asks for (copied from this interpreter's site-packages, markers evaluated,
transitively). Without extras that is the client: it imports, ``fencingctl`` runs, and
``fencingd`` says in one line which extra it needs; with ``[server]`` added, ``fencingd`` runs.
"""

from __future__ import annotations

import configparser
import email.parser
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

# packaging comes with pytest: the requirement and marker grammar, not reimplemented here.
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ("core", "raft", "server", "client", "api")
HARNESS = ("testsupport", "tests", "chaos", "bench")
SCRIPTS = {"fencingd": "coordinator.server.fencingd:main", "fencingctl": "coordinator.client.fencingctl:main"}
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".hypothesis", "runs", "chaos-runs", "fencing-dev-data")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    base = tmp_path_factory.mktemp("wheel")
    src, out = base / "src", base / "dist"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCE)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("fencing_coordinator-*.whl")
    with zipfile.ZipFile(path) as zf:
        yield zf


def _source_modules() -> set[str]:
    """Every module file of the product in this checkout, as wheel paths."""
    found = set()
    for root, dirs, files in os.walk(os.path.join(REPO, "coordinator")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith((".py", ".pyi")):
                found.add(os.path.relpath(os.path.join(root, name), REPO).replace(os.sep, "/"))
    return found


def test_wheel_holds_every_product_module(wheel):
    names = set(wheel.namelist())
    missing = _source_modules() - names
    assert not missing, f"modules left out of the wheel: {sorted(missing)}"
    for layer in LAYERS:
        assert f"coordinator/{layer}/__init__.py" in names, layer
    assert {"coordinator/api/v1/fencing_pb2.py", "coordinator/api/v1/fencing_pb2_grpc.py"} <= names


def test_wheel_holds_no_test_harness(wheel):
    tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    assert not tops & set(HARNESS), sorted(tops)
    assert {t for t in tops if not t.endswith(".dist-info")} == {"coordinator"}, sorted(tops)


def test_console_scripts_point_at_the_server_and_client_packages(wheel):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    assert dict(parser["console_scripts"]) == SCRIPTS
    for target in SCRIPTS.values():
        module, func = target.split(":")
        source = wheel.read(module.replace(".", "/") + ".py").decode()
        assert f"\ndef {func}(" in source, target


# -- installed as a user would --------------------------------------------------------------

SERVER_ONLY = {"pysyncobj", "prometheus-client", "grpcio-health-checking", "grpcio-reflection"}
SERVER_MODULES = ("pysyncobj", "prometheus_client", "grpc_health", "grpc_reflection")
INSTALL_SERVER = "pip install 'fencing-coordinator[server]'"
# The guards' optional extras -> the one distribution each adds (pure Python both).
GUARD_EXTRAS = {"redis": "redis", "mysql": "pymysql"}
# The child must see the venv only: not this checkout (conftest puts it on PYTHONPATH).
_CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")} | {"PYTHONNOUSERSITE": "1"}


def _requires_dist(wheel: zipfile.ZipFile) -> list[Requirement]:
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return [
        Requirement(r) for r in email.parser.Parser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist")
    ]


def _needed(requirements: list[Requirement], extras: set[str]) -> dict[str, importlib.metadata.Distribution]:
    """Every installed distribution these requirements pull in, for the given extras, transitively."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [r for r in requirements if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras)]
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        if key in found:
            continue
        found[key] = dist = importlib.metadata.distribution(req.name)
        for line in dist.requires or ():
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in req.extras | {""}):
                todo.append(sub)
    return found


def _copy_into(dists, site: pathlib.Path) -> None:
    for dist in dists:
        for rel in dist.files or ():
            src = pathlib.Path(dist.locate_file(rel))
            if rel.parts[0] != ".." and src.is_file():  # "..": console scripts, not needed here
                (site / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, site / rel)


def _run(venv: pathlib.Path, program: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / program), *args], capture_output=True, text=True,
                          timeout=120, env=_CLEAN_ENV, cwd=venv)


@pytest.fixture(scope="module")
def client_venv(wheel, tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """A fresh venv holding the wheel and only its base dependencies; (venv, site-packages)."""
    venv = tmp_path_factory.mktemp("client") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index",
         "--disable-pip-version-check", "-q", wheel.filename],
        # Without PYTHONPATH: pip re-runs itself in the venv's interpreter, and a checkout on
        # PYTHONPATH holding an editable install's egg-info made it see the package as installed
        # already and install nothing.
        capture_output=True, text=True, timeout=300, env=_CLEAN_ENV,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = pathlib.Path(_run(venv, "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                        .stdout.strip())
    _copy_into(_needed(_requires_dist(wheel), {""}).values(), site)
    return venv, site


def test_the_client_needs_none_of_the_servers_dependencies(wheel):
    client = set(_needed(_requires_dist(wheel), {""}))
    assert not client & SERVER_ONLY, sorted(client & SERVER_ONLY)
    assert {"grpcio", "msgpack", "cryptography", "protobuf"} <= client
    assert SERVER_ONLY <= set(_needed(_requires_dist(wheel), {"", "server"}))
    # Each store's extra brings its driver and nothing else; the client brings no driver.
    assert not client & set(GUARD_EXTRAS.values()) and "psycopg" not in client, sorted(client)
    for extra, driver in GUARD_EXTRAS.items():
        assert set(_needed(_requires_dist(wheel), {"", extra})) - client == {driver}, extra
    assert "coordinator/py.typed" in wheel.namelist()  # PEP 561: users' type checkers read the annotations


def test_a_client_install_imports_the_client_and_runs_fencingctl(client_venv):
    venv, _ = client_venv
    probe = (
        "import importlib, importlib.util, coordinator\n"
        "from coordinator.client import FencingClient, exceptions\n"
        "from coordinator.client.guard import SqliteGuard\n"
        "from coordinator.client.proof import ProofVerifier\n"
        "print(coordinator.__file__)\n"
        f"print([m for m in {SERVER_MODULES!r} if importlib.util.find_spec(m)])\n"
        "try:\n    import coordinator.client.pg_guard\nexcept ImportError as exc:\n    print(exc)\n"
        "for m in ('redis_guard', 'mysql_guard'):\n"
        "    try:\n        importlib.import_module('coordinator.client.' + m)\n"
        "    except ImportError as exc:\n        print(exc)\n"
    )
    proc = _run(venv, "python", "-c", probe)
    assert proc.returncode == 0, proc.stderr
    where, server_modules, pg_hint, redis_hint, mysql_hint = proc.stdout.splitlines()
    assert where.startswith(str(venv)) and server_modules == "[]", proc.stdout  # the venv's copy, alone
    assert pg_hint.endswith("pip install 'fencing-coordinator[postgres]'"), pg_hint
    assert redis_hint.endswith("pip install 'fencing-coordinator[redis]'"), redis_hint
    assert mysql_hint.endswith("pip install 'fencing-coordinator[mysql]'"), mysql_hint
    assert len(list(venv.glob("lib/python*/site-packages/coordinator/py.typed"))) == 1
    help_ = _run(venv, "fencingctl", "--help")
    assert help_.returncode == 0 and help_.stdout.startswith("usage: fencingctl"), help_.stdout + help_.stderr


def test_fencingd_without_the_server_extra_says_so_in_one_line(wheel, client_venv):
    venv, site = client_venv
    for argv in (["dev", "--help"], ["serve", "--config", "node1.toml"], ["--help"]):
        proc = _run(venv, "fencingd", *argv)
        assert proc.returncode != 0, argv
        assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr  # one line, no traceback
        assert proc.stderr.startswith("fencingd: ") and proc.stderr.rstrip().endswith(INSTALL_SERVER), proc.stderr
        assert "pysyncobj" in proc.stderr and "prometheus-client" in proc.stderr
    # ...and with the extra's distributions added, it gets past that line.
    _copy_into(_needed(_requires_dist(wheel), {"", "server"}).values(), site)
    help_ = _run(venv, "fencingd", "--help")
    assert help_.returncode == 0 and help_.stdout.startswith("usage: fencingd"), help_.stdout + help_.stderr


@pytest.mark.parametrize("extra, module, name", [("redis", "redis_guard", "RedisGuard"),
                                                ("mysql", "mysql_guard", "MySQLGuard")])
def test_a_guards_extra_is_all_its_guard_needs(wheel, client_venv, extra, module, name):
    venv, site = client_venv
    _copy_into(_needed(_requires_dist(wheel), {"", extra}).values(), site)
    proc = _run(venv, "python", "-c", f"from coordinator.client.{module} import {name}; print({name}.__name__)")
    assert proc.returncode == 0 and proc.stdout.strip() == name, proc.stdout + proc.stderr
