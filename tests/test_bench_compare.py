"""``python -m bench compare`` runs end to end against a real etcd and reports every cell (no
speed asserted), its etcd stubs are what protoc makes of its proto, and it says how to install
etcd when there is none.

The smoke run needs Debian's etcd-server (.ci/run installs it); without it the test fails with
the install command rather than skipping.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = "bench/etcdpb/rpc.proto"
GENERATED = ("rpc_pb2.py", "rpc_pb2.pyi", "rpc_pb2_grpc.py")
WORKLOADS = ("write", "acqrel", "cycle", "read")


def _env(**extra) -> dict:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *parts]), **extra}


def test_compare_smoke_reports_every_cell_and_failover(tmp_path):
    from bench.etcd_cluster import INSTALL_HINT

    assert shutil.which("etcd"), INSTALL_HINT
    out, png = tmp_path / "compare.json", tmp_path / "compare.png"
    proc = subprocess.run(
        # 1 s a cell: in a 0.3 s window etcd once completed no acquire + release cycle at all
        # (a NaN ratio in a fresh-clone CI run; both systems answer within 1 s even then).
        [sys.executable, "-m", "bench", "compare", "--seconds", "1.0", "--warmup", "0.1", "--rounds", "1",
         "--clients", "1,2", "--procs", "1", "--trials", "1", "--json", str(out), "--chart", str(png),
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=280, cwd=ROOT, env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cells = {(c["workload"], c["clients"]): c for c in report["cells"]}
    assert set(cells) == {(w, n) for w in WORKLOADS for n in (1, 2)}
    for key, cell in cells.items():
        assert math.isfinite(cell["ratio"]) and cell["ratio"] > 0, (key, cell)
        for system in ("ours", "etcd"):
            figures = cell[system]
            assert figures["runs"] == 1 and figures["ops_per_s"] > 0, (key, system, figures)
            for name in ("p50_ms", "p99_ms", "server_cpu_ms_per_op", "client_cpu_ms_per_op"):
                assert math.isfinite(figures[name]) and figures[name] >= 0, (key, system, name, figures)
    failover = {(f["kind"], f["system"]): f for f in report["failover"]}
    assert set(failover) == {(k, s) for k in ("kill", "stop") for s in ("ours", "etcd")}
    for key, f in failover.items():
        assert f["trials"] == 1 and f["failed"] == 0 and f["p50_ms"] > 0, (key, f)
    # Every cell and every failover line is in the printed table too.
    assert proc.stdout.count("linearizable read") == 2 and "SIGSTOP  etcd" in proc.stdout, proc.stdout
    try:
        import matplotlib  # noqa: F401 - the bench extra
    except ImportError:
        assert "pip install '.[bench]'" in proc.stdout and report["chart"] is None
    else:
        assert report["chart"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_etcd_compare_says_how_to_install_it(tmp_path):
    empty = tmp_path / "bin"  # a PATH with no etcd on it
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "bench", "compare", "--trials", "0"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=_env(PATH=str(empty)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bench compare: etcd not found: install it with `apt-get install -y etcd-server etcd-client` "
        "(Debian 12 ships 3.4)"]


def test_the_ratio_is_the_median_of_same_round_ratios():
    from bench._compare_report import cells

    def row(system, rnd, ops):
        return {"system": system, "workload": "write", "clients": 1, "round": rnd, "ops_per_s": ops,
                "p50_ms": 1.0, "p99_ms": 2.0, "server_cpu_ms_per_op": 1.0, "client_cpu_ms_per_op": 0.5,
                "errors": {}, "setup_errors": {}}

    # Per round: 100/100, 300/100, 200/400 -> ratios 1, 3, 0.5 -> median 1. The ratio of the
    # medians (200/100 = 2) would hide that the systems swapped places in a slow round.
    rows = [row("ours", 1, 100), row("etcd", 1, 100), row("ours", 2, 300), row("etcd", 2, 100),
            row("ours", 3, 200), row("etcd", 3, 400)]
    (cell,) = cells(rows)
    assert cell["ratio"] == 1.0 and sorted(cell["ratios"]) == [0.5, 1.0, 3.0]
    assert cell["ours"]["ops_per_s"] == 200 and cell["etcd"]["ops_per_s"] == 100


def test_each_ours_client_kind_gets_its_own_ratio_to_etcd_of_the_same_round():
    from bench._compare_report import cells
    from bench.compare import parse_args

    def row(system, rnd, ops):
        return {"system": system, "workload": "write", "clients": 64, "round": rnd, "ops_per_s": ops,
                "p50_ms": 1.0, "p99_ms": 2.0, "server_cpu_ms_per_op": 1.0, "client_cpu_ms_per_op": 0.5,
                "errors": {}, "setup_errors": {}}

    rows = [row("ours-mux", 1, 300), row("ours", 1, 100), row("etcd", 1, 200),
            row("ours", 2, 100), row("etcd", 2, 100), row("ours-mux", 2, 150)]
    (cell,) = cells(rows)
    assert cell["systems"] == ["ours", "ours-mux", "etcd"]
    assert cell["ratios_by_system"] == {"ours": [0.5, 1.0], "ours-mux": [1.5, 1.5]}
    assert cell["ratio_by_system"] == {"ours": 0.75, "ours-mux": 1.5} and cell["ratio"] == 0.75
    assert parse_args(["--ours-client", "raw,multiplex"]).ours_clients == ["raw", "multiplex"]
    for bad in ("raw,raw", "grpc", ""):
        with pytest.raises(SystemExit):
            parse_args(["--ours-client", bad])


def test_failover_b_is_a_system_of_its_own_in_the_failover_cells():
    from bench._compare_report import failover_cells
    from bench.compare import parse_args

    trials = [{"system": system, "kind": "kill", "seconds": seconds}
              for system, seconds in (("ours", 0.4), ("ours-b", 1.3), ("etcd", 1.1), ("ours", 0.5),
                                      ("etcd", 1.2), ("ours-b", 1.4))]
    got = {f["system"]: (f["trials"], f["min_ms"], f["max_ms"]) for f in failover_cells(trials)}
    assert [f["system"] for f in failover_cells(trials)] == ["ours", "ours-b", "etcd"]
    assert got["ours-b"][0] == 2 and round(got["ours-b"][1]) == 1300 and round(got["ours-b"][2]) == 1400
    args = parse_args(["--rounds", "0", "--failover-b", "leader_lost_election_s=0"])
    assert args.failover_b_settings == {"leader_lost_election_s": 0}
    for bad in (["--failover-b", "noequals"], ["--trials", "0", "--failover-b", "a=1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_generated_etcd_stubs_are_up_to_date(tmp_path):
    import grpc_tools  # noqa: F401 - the test extra

    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         f"--grpc_python_out={tmp_path}", PROTO],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )
    for name in GENERATED:
        fresh = (tmp_path / "bench" / "etcdpb" / name).read_text(encoding="utf-8")
        with open(os.path.join(ROOT, "bench", "etcdpb", name), encoding="utf-8") as f:
            assert f.read() == fresh, f"bench/etcdpb/{name} is stale: regenerate as {PROTO} says"


def test_etcd_stubs_use_etcds_method_paths_and_field_numbers():
    # The numbers a real etcd decodes by; a wrong one would be silently ignored by protobuf.
    from bench.etcdpb import rpc_pb2 as epb

    pool = epb.DESCRIPTOR
    assert [s.full_name for s in pool.services_by_name.values()] == [
        "etcdserverpb.KV", "etcdserverpb.Lease", "etcdserverpb.Maintenance"]
    numbers = {
        "Compare": {"result": 1, "target": 2, "key": 3, "create_revision": 5, "value": 7, "range_end": 64},
        "TxnRequest": {"compare": 1, "success": 2, "failure": 3},
        "RequestOp": {"request_put": 2},
        "PutRequest": {"key": 1, "value": 2, "lease": 3},
        "RangeRequest": {"key": 1, "serializable": 7},
        "LeaseGrantRequest": {"TTL": 1},
        "LeaseGrantResponse": {"ID": 2},
        "LeaseRevokeRequest": {"ID": 1},
        "StatusResponse": {"header": 1, "leader": 4},
        "ResponseHeader": {"member_id": 2, "revision": 3},
    }
    for message, fields in numbers.items():
        by_name = pool.message_types_by_name[message].fields_by_name
        assert {name: by_name[name].number for name in fields} == fields, message
