"""The built wheel ships the product and nothing else.

Builds the wheel from a copy of this checkout (offline: no index, no build isolation, the
venv's setuptools) and lists its files: every module under coordinator/ — the core, raft,
server and client layers and the generated API — and no test harness (testsupport/, tests/,
chaos/, bench/). The copy leaves out build/ and *.egg-info: setuptools reuses a stale build/lib,
which could put deleted modules into the wheel, and the checkout stays untouched.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

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
