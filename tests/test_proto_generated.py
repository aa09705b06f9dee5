"""The committed generated code in coordinator/api/v1 is exactly what protoc makes of proto/, and
the copy of the .proto that ships in the wheel (coordinator/api/v1/fencing.proto, package data:
tests/test_wheel.py) is proto/'s, byte for byte.

Regenerates with the pinned grpcio-tools (the test extra) into a temporary directory and
compares byte for byte. On failure, regenerate (and copy) from the repository root with:

    python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. \\
        proto/coordinator/api/v1/fencing.proto
    cp proto/coordinator/api/v1/fencing.proto coordinator/api/v1/fencing.proto

proto/ is the source (the repository's layout keeps the API's definition at the top); the
package holds a copy because a wheel ships only what is inside the package.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = "coordinator/api/v1/fencing.proto"
GENERATED = ("fencing_pb2.py", "fencing_pb2.pyi", "fencing_pb2_grpc.py")


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools is in the test extra: pip install -e '.[test]'")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", os.path.join("proto", PROTO)],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )
    out_dir = tmp_path / "coordinator" / "api" / "v1"
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(GENERATED)  # protoc writes no .proto
    stale = []
    for name in GENERATED:
        fresh = (out_dir / name).read_text(encoding="utf-8")
        committed_path = os.path.join(ROOT, "coordinator", "api", "v1", name)
        with open(committed_path, encoding="utf-8") as f:
            committed = f.read()
        if fresh != committed:
            diff = difflib.unified_diff(committed.splitlines(), fresh.splitlines(), f"committed/{name}",
                                        f"regenerated/{name}", lineterm="", n=1)
            stale.append("\n".join(list(diff)[:40]))
    assert not stale, "generated code is out of date (see the module docstring):\n" + "\n\n".join(stale)


def test_generated_code_is_an_importable_package():
    from coordinator.api.v1 import fencing_pb2, fencing_pb2_grpc

    names = [s.full_name for s in fencing_pb2.DESCRIPTOR.services_by_name.values()]
    assert names == [
        "fencing.v1.Lease", "fencing.v1.FencedStore", "fencing.v1.Cluster", "fencing.v1.Admin", "fencing.v1.Watch",
    ]
    for service in ("Lease", "FencedStore", "Cluster", "Admin"):
        assert hasattr(fencing_pb2_grpc, f"{service}Stub")
        assert hasattr(fencing_pb2_grpc, f"add_{service}Servicer_to_server")


def test_the_wheel_s_copy_of_the_proto_is_the_source():
    with open(os.path.join(ROOT, "proto", PROTO), "rb") as f:
        source = f.read()
    with open(os.path.join(ROOT, PROTO), "rb") as f:
        shipped = f.read()
    assert shipped == source, f"{PROTO} differs from proto/{PROTO}: cp proto/{PROTO} {PROTO}"

