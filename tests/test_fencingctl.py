"""Tests of fencingctl (coordinator.client.fencingctl): strict input checks, exit codes, output.

Most tests run ``main([...])`` in-process against ``testsupport.inmemory.InMemoryCluster``
(the real servicers over an in-memory log; it records every call, so "nothing was sent" is
checked, not assumed); a few run the real command in a subprocess, and the last ones drive a
real three-process cluster.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import signal
import subprocess
import sys
import tomllib

import grpc
import pytest

from coordinator.client import DEFAULT_ENDPOINTS
from coordinator.client import fencingctl as cli_ctl
from coordinator.core import limits
from coordinator.core.names import ErrorMeta as M
from coordinator.core.names import ErrorReason as R
from coordinator.core.state_machine import Reason
from coordinator.server.errors import Failure
from testsupport.inmemory import InMemoryCluster
from testsupport.inmemory_faults import fail, queue_full, refuse, unknown_before_apply, unlisted_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cluster():
    with InMemoryCluster() as cluster:
        yield cluster


class Ctl:
    """Run fencingctl in-process against one cluster; returns (exit code, stdout, stderr)."""

    def __init__(self, endpoints, capsys):
        self.endpoints = ",".join(endpoints)
        self.capsys = capsys

    def __call__(self, *argv: str, output: str = "table", timeout: str = "3"):
        self.capsys.readouterr()
        code = cli_ctl.main(["--endpoints", self.endpoints, "--output", output, "--timeout", timeout, *argv])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str, timeout: str = "3"):
        code, out, err = self(*argv, output="json", timeout=timeout)
        return code, json.loads(out) if out.strip() else None, err


@pytest.fixture
def ctl(cluster, capsys):
    return Ctl(cluster.endpoints, capsys)


def acquire(ctl, resource="orders/7", holder="a") -> int:
    code, doc, _ = ctl.json("acquire", resource, "--ttl-ms", "5000", "--holder", holder)
    assert code == 0
    return doc["token"]


# ---------------------------------------------------------------- malformed tokens


@pytest.mark.parametrize("token", ["0", "-1", "1.5", "abc", "0x10", "", "+3", "1e3", str(2**64)])
def test_malformed_token_arguments_exit_2_and_send_nothing(cluster, ctl, token):
    code, out, err = ctl("write", "orders/7", "k", "v", "--token", token)
    assert code == cli_ctl.EXIT_USAGE == 2
    assert err.startswith("fencingctl: invalid argument: token must be a whole number from 1")
    assert err.count("\n") == 1
    assert cluster.calls == []


def test_missing_token_exits_2_and_sends_nothing(cluster, ctl):
    code, _, err = ctl("write", "orders/7", "k", "v")
    assert code == 2
    assert err == "fencingctl: invalid argument: write: missing --token\n"
    assert cluster.calls == []


@pytest.mark.parametrize(
    "token_json",
    ["0", "-1", "1.5", "1.0", "\"1\"", "true", "false", "null", "1e3", str(2**64), "[1]", "{}", "NaN"],
)
def test_malformed_json_tokens_exit_2_and_send_nothing(cluster, ctl, token_json):
    request = f'{{"resource": "orders/7", "key": "k", "value": "v", "token": {token_json}}}'
    code, doc, err = ctl.json("write", "--json", request)
    assert code == 2
    assert err.count("\n") == 1 and ("token" in err or "NaN is not a number" in err)
    assert doc["error"]["exit_code"] == 2 and doc["error"]["category"] in ("invalid argument",)
    assert cluster.calls == []


def test_json_token_missing_exits_2(cluster, ctl):
    code, _, err = ctl("write", "--json", '{"resource": "orders/7", "key": "k", "value": "v"}')
    assert code == 2 and "missing field 'token'" in err
    assert cluster.calls == []


def test_json_request_with_a_good_token_writes(cluster, ctl):
    token = acquire(ctl)
    request = json.dumps({"resource": "orders/7", "key": "k", "value": "v", "token": token})
    code, doc, _ = ctl.json("write", "--json", request)
    assert code == 0 and doc["version"] == 1 and doc["hwm"] == token
    code, doc, _ = ctl.json(
        "write", "--json",
        json.dumps({"resource": "orders/7", "key": "bin", "value_base64": "AAH/", "token": token}),
    )
    assert code == 0
    code, doc, _ = ctl.json("read", "orders/7", "bin")
    assert doc["value"] is None and base64.b64decode(doc["value_base64"]) == b"\x00\x01\xff"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["write", "--json", '{"resource": "r", "key": "k", "value": "v", "token": 1, "tokn": 2}'],
         "unknown field(s) tokn"),
        (["write", "orders/7", "--json", '{"resource": "r"}'], "either as arguments or as --json"),
        (["write", "--json", "[1]"], "must be a JSON object"),
        (["write", "--json", "{not json"], "not valid JSON"),
        (["write", "--json", '{"resource": "r", "key": "k", "token": 1}'], "exactly one of value"),
        (["acquire", "orders/7"], "missing --ttl-ms"),
        (["acquire", "orders/7", "--ttl-ms", "5"], "ttl_ms must be in [100"),
        (["acquire", "orders/7", "--ttl-ms", "50ms"], "ttl_ms must be in [100"),
        (["acquire", "orders/7", "--ttl-ms", "ten seconds"], "is not a duration"),
        (["acquire", "orders/7", "--ttl-ms", "1.5ms"], "whole number of milliseconds"),
        (["acquire", "orders/7", "--ttl-ms", "10s", "--wait-ms", "1h"], "wait_ms must be in [0"),
        (["endpoint"], "required"),
        (["--endpoints", "http://127.0.0.1:7100", "status"], "without a scheme"),
        (["acquire", "--json", '{"resource": "r", "ttl_ms": 5000.0}'], "ttl_ms must be a JSON integer"),
        (["write", "orders/7", "k", "v", "--token", "1", "--op-id", "abc"], "op_id must be 16-64 bytes"),
        (["write", "orders/7", "k", "v", "--token", "1", "--expected-version", "-1"], "expected_version"),
        (["describe"], "missing RESOURCE"),
        (["frobnicate"], "invalid choice"),
        (["admin"], "required"),
    ],
)
def test_usage_errors_exit_2_with_one_line(cluster, ctl, argv, message):
    code, out, err = ctl(*argv)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("fencingctl: ") and message in last, err
    assert cluster.calls == []


def test_server_side_invalid_argument_exits_2(cluster, ctl):
    code, _, err = ctl("write", "orders 7", "k", "v", "--token", "1")  # caught by the client
    assert code == 2 and "field 'resource'" in err
    cluster.inject("Describe", fail(Failure.INVALID_INPUT, "bad resource", field="resource"))
    code, doc, err = ctl.json("describe", "orders/7")
    assert code == 2 and doc["error"]["reason"] == R.INVALID_FIELD
    assert err == "fencingctl: invalid argument: field 'resource': bad resource\n"


# ---------------------------------------------------------------- exit codes and one-line errors


def test_stale_token_is_refused_with_exit_3_and_a_friendly_line(cluster, ctl):
    old = acquire(ctl)
    assert ctl("admin", "force-release", "orders/7")[0] == 0
    code, doc, err = ctl.json("write", "orders/7", "k", "v", "--token", str(old))
    assert code == cli_ctl.EXIT_REFUSED == 3
    assert err == f"fencingctl: refused: token {old} is stale for orders/7 (high-water mark is {old + 1})\n"
    e = doc["error"]
    assert (e["type"], e["reason"], e["code"], e["metadata"]) == (
        "StaleToken", R.STALE_TOKEN, "FAILED_PRECONDITION", {M.HWM: str(old + 1)})
    assert len(e["op_id"]) == 32


def test_each_refusal_reason_has_its_line_and_code(cluster, ctl):
    token = acquire(ctl, holder="worker-a")
    code, _, err = ctl("acquire", "orders/7", "--ttl-ms", "5000", "--holder", "b")
    assert code == 3 and err.startswith("fencingctl: refused: orders/7 is held by 'worker-a' (token 1), ")
    assert err.endswith("s of its TTL left\n") and "1970" not in err, err
    code, _, err = ctl("write", "orders/7", "k", "v", "--token", "9")
    assert (code, err) == (3, "fencingctl: refused: token 9 was never issued for orders/7 (high-water mark is 1)\n")
    ctl("write", "orders/7", "k", "v", "--token", str(token))
    code, _, err = ctl("write", "orders/7", "k", "v2", "--token", str(token), "--expected-version", "0")
    assert (code, err) == (3, "fencingctl: refused: key 'k' in orders/7 is at version 1, not 0\n")
    assert ctl("release", "orders/7", "--token", str(token))[0] == 0
    code, _, err = ctl("keepalive", "orders/7", "--token", str(token))
    assert code == 3 and "has ended; acquire a new one" in err
    cluster.inject("Write", refuse(Reason.OP_ID_CONFLICT, "used"))
    code, _, err = ctl("write", "orders/7", "k", "v", "--token", str(token), "--op-id", "ab" * 16)
    assert (code, err) == (3, f"fencingctl: refused: op id {'ab' * 16} was already used for a different request\n")


@pytest.mark.parametrize(
    "fault, exit_code, start",
    [
        (refuse(Reason.LIMIT_EXCEEDED, "detail"), 7, "fencingctl: limit: "),
        (refuse(Reason.EPOCH_EXHAUSTED, "detail"), 7, "fencingctl: limit: every fencing token"),
        (fail(Failure.UNAUTHENTICATED, "detail"), 6, "fencingctl: unauthenticated: "),
        (fail(Failure.PERMISSION_DENIED, "detail"), 6, "fencingctl: permission denied: "),
        (unlisted_status(grpc.StatusCode.INTERNAL, "detail"), 1, "fencingctl: server error: INTERNAL: "),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_other_statuses_exit_codes(cluster, ctl, fault, exit_code, start):
    cluster.inject("Describe", fault)
    rc, _, err = ctl("describe", "orders/7")
    assert rc == exit_code and err.startswith(start) and err.count("\n") == 1


def test_overloaded_until_the_deadline_exits_7(cluster, ctl):
    cluster.inject("Describe", *[queue_full()] * 50)  # the service answers OVERLOADED
    # 3 s, not 1: on a loaded machine finding the leader took most of one second, and the
    # deadline then ran out before any answer (exit 4, unavailable) instead of after OVERLOADED.
    rc, _, err = ctl("describe", "orders/7", timeout="3")
    assert rc == 7 and err.startswith("fencingctl: overloaded: the cluster is overloaded")


def test_admin_credentials(capsys, monkeypatch):
    with InMemoryCluster(admin_token="sekret") as cluster:
        ctl = Ctl(cluster.endpoints, capsys)
        assert ctl("admin", "force-release", "orders/7")[0] == 6
        assert ctl("admin", "force-release", "orders/7", "--admin-token", "nope")[0] == 6
        assert ctl("--admin-token", "sekret", "admin", "force-release", "orders/7")[0] == 0
        monkeypatch.setenv(cli_ctl.ADMIN_TOKEN_ENV, "sekret")
        code, doc, _ = ctl.json("admin", "set-epoch-floor", "50")
        assert code == 0 and doc["epoch"] == 51


def test_unavailable_exits_4(cluster, ctl):
    cluster.close()
    code, doc, err = ctl.json("write", "orders/7", "k", "v", "--token", "1", timeout="1")
    assert code == cli_ctl.EXIT_UNAVAILABLE == 4
    assert err.startswith("fencingctl: unavailable: ") and err.count("\n") == 1
    assert doc["error"]["type"] == "Unavailable"


def test_outcome_unknown_exits_5_and_prints_the_op_id_to_retry_with(cluster, ctl):
    token = acquire(ctl)
    cluster.inject("Write", *[unknown_before_apply()] * 100)
    code, doc, err = ctl.json("write", "orders/7", "k", "v", "--token", str(token), timeout="1")
    assert code == cli_ctl.EXIT_OUTCOME_UNKNOWN == 5
    op_id = doc["error"]["op_id"]
    assert f"retry with op id {op_id}" in err and err.startswith("fencingctl: outcome unknown: ")
    cluster.clear_faults()
    code, doc, _ = ctl.json("write", "orders/7", "k", "v", "--token", str(token), "--op-id", op_id)
    assert code == 0 and doc["op_id"] == op_id
    code, again, _ = ctl.json("write", "orders/7", "k", "v", "--token", str(token), "--op-id", op_id)
    assert again["version"] == doc["version"]  # the same op_id applied once


# ---------------------------------------------------------------- commands and output


def test_every_command_in_table_and_json(cluster, ctl, tmp_path):
    code, out, _ = ctl("status")
    assert code == 0 and "leader" in out and cluster.members[0].member_id in out
    code, doc, _ = ctl.json("status")
    assert code == 0 and doc["leader_api_address"] == cluster.endpoints[0] and len(doc["members"]) == 3
    token = acquire(ctl)
    code, out, _ = ctl("describe", "orders/7")
    assert code == 0 and "holder" in out and "a" in out
    code, doc, _ = ctl.json("keepalive", "orders/7", "--token", str(token))
    assert code == 0 and doc["token"] == token
    value_file = tmp_path / "value.bin"
    value_file.write_bytes(b"\xff\x00bytes")
    code, doc, _ = ctl.json("write", "orders/7", "k", "--value-file", str(value_file), "--token", str(token))
    assert code == 0 and doc["version"] == 1
    code, out, _ = ctl("read", "orders/7", "k")
    assert code == 0 and "found" in out and base64.b64encode(b"\xff\x00bytes").decode() in out
    code, doc, _ = ctl.json("read", "orders/7", "nope")
    assert code == 0 and doc["found"] is False and doc["value"] is None
    code, doc, _ = ctl.json("delete", "orders/7", "k", "--token", str(token))
    assert code == 0 and doc["deleted"] is True
    code, doc, _ = ctl.json("release", "orders/7", "--token", str(token))
    assert code == 0 and doc["released"] is True
    snap = tmp_path / "backup.bin"
    code, doc, _ = ctl.json("admin", "snapshot", "--out", str(snap))
    assert code == 0 and doc["bytes"] == snap.stat().st_size > 0
    code, doc, _ = ctl.json("admin", "restore", "--in", str(snap), "--epoch-floor", "1000")
    assert code == 0 and doc["epoch"] == 1000  # max(floor, the backup's epoch + 1): the floor here
    code, doc, _ = ctl.json("admin", "restore", "--in", str(snap), "--json", '{"epoch_floor": 2000}')
    assert code == 0
    code, _, err = ctl("admin", "restore", "--in", str(tmp_path / "missing"), "--epoch-floor", "5")
    assert code == 2 and "cannot read --in" in err


def test_durations_remaining_ttl_and_not_found_as_people_read_them(cluster, ctl):
    """Issue 29's Display items: durations in, a remaining TTL out (raw clock fields in JSON
    only), "not found" for a missing key, a refused Acquire with the holder's TTL left."""
    code, out, err = ctl("acquire", "orders/7", "--ttl-ms", "10s", "--holder", "a", "--wait-ms", "500ms")
    assert code == 0, err
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert rows["ttl"] == "10s" and "expires_at_ms" not in rows
    code, out, _ = ctl("describe", "orders/7")
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert code == 0 and rows["held"] == "yes" and rows["holder"] == "a"
    assert rows["remaining_ttl"].endswith("s") and 0 < float(rows["remaining_ttl"][:-1]) <= 10, out
    assert "expires_at_ms" not in out and "log_clock_ms" not in out
    code, doc, _ = ctl.json("describe", "orders/7")
    assert code == 0 and doc["remaining_ms"] == doc["expires_at_ms"] - doc["log_clock_ms"] > 0
    code, _, err = ctl("acquire", "orders/7", "--ttl-ms", "1m", "--holder", "b")
    assert code == 3 and "of its TTL left" in err and "1970" not in err and "log clock" not in err, err
    code, out, _ = ctl("read", "orders/7", "missing")
    assert code == 0 and "(not found)" in out and "None" not in out, out
    code, doc, _ = ctl.json("read", "orders/7", "missing")
    assert code == 0 and doc["found"] is False and doc["value"] is None
    code, doc, _ = ctl.json("keepalive", "orders/7", "--token", "1", "--ttl-ms", "2.5s")
    assert code == 0 and doc["expires_at_ms"] > 0
    code, out, _ = ctl("describe", "orders/8")  # never held
    assert code == 0 and dict(line.split(None, 1) for line in out.splitlines())["remaining_ttl"] == "-"


def test_duration_text_reads_back():
    from coordinator.client.durations import parse_s, text_ms

    assert [text_ms(ms) for ms in (0, 750, 1000, 29_500, 59_999, 60_000, 250_000, 7_205_000)] == [
        "0ms", "750ms", "1s", "29.5s", "59.9s", "1m0s", "4m10s", "2h0m5s"]
    assert parse_s(text_ms(29_500), default_unit="s") == 29.5


def test_endpoint_commands_in_table_and_json(cluster, ctl):
    code, doc, err = ctl.json("endpoint", "status")
    assert code == 0, err
    assert [e["endpoint"] for e in doc["endpoints"]] == list(cluster.endpoints)
    assert all(e["reachable"] and e["version"] and e["term"] >= 1 for e in doc["endpoints"])
    code, out, _ = ctl("endpoint", "status")
    assert code == 0 and len(out.splitlines()) == 1 + len(cluster.endpoints)


def test_global_options_work_after_the_command(cluster, capsys):
    capsys.readouterr()
    code = cli_ctl.main(["status", "--endpoints", ",".join(cluster.endpoints), "-o", "json"])
    out = capsys.readouterr().out
    assert code == 0 and json.loads(out)["epoch"] == 0


def test_endpoints_from_the_environment_and_the_default(cluster, capsys, monkeypatch):
    monkeypatch.setenv(cli_ctl.ENDPOINTS_ENV, ",".join(cluster.endpoints))
    capsys.readouterr()
    assert cli_ctl.main(["status"]) == 0
    assert DEFAULT_ENDPOINTS == ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")
    assert ",".join(DEFAULT_ENDPOINTS) in cli_ctl.build_parser().format_help()
    code = cli_ctl.main(["--endpoints", "nonsense", "status"])
    assert code == 2 and "host:port" in capsys.readouterr().err


def test_help_documents_the_exit_codes(capsys):
    assert cli_ctl.main(["--help"]) == 0
    out = capsys.readouterr().out
    for line in ("0  ok", "2  usage", "3  refused", "4  unavailable", "5  outcome unknown",
                 "6  unauthenticated", "7  limit"):
        assert line in out
    assert cli_ctl.main(["write", "--help"]) == 0
    assert "exit codes" in capsys.readouterr().out
    for code in range(8):
        assert f"    {code}  " in cli_ctl.__doc__


def test_console_script_is_declared():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    module, _, func = scripts["fencingctl"].partition(":")
    assert callable(getattr(importlib.import_module(module), func))


def _run(*argv, env=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "coordinator.client.fencingctl", *argv],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_subprocess_exit_codes(cluster):
    eps = ",".join(cluster.endpoints)
    proc = _run("--endpoints", eps, "write", "--json", '{"resource": "r", "key": "k", "value": "v", "token": 0}')
    assert proc.returncode == 2 and "token" in proc.stderr and proc.stdout == ""
    assert cluster.calls == []
    proc = _run("--endpoints", eps, "-o", "json", "acquire", "orders/7", "--ttl-ms", "5000")
    assert proc.returncode == 0 and json.loads(proc.stdout)["token"] == 1
    proc = _run("--endpoints", eps, "write", "orders/7", "k", "v", "--token", "2")
    assert proc.returncode == 3 and proc.stderr.startswith("fencingctl: refused: token 2 was never issued")


# ---------------------------------------------------------------- real three-process cluster


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory, request):
    from testsupport.grpc_cluster import running_cluster

    yield from running_cluster(str(tmp_path_factory.mktemp("ctl-cluster")), request)


def test_real_cluster_acquire_write_fence_read(real_cluster, capsys):
    eps = [n.api_address for n in real_cluster.nodes]
    ctl = Ctl(eps, capsys)
    proc = _run("status", env={cli_ctl.ENDPOINTS_ENV: ",".join(eps)})  # the real command
    assert proc.returncode == 0 and "has_quorum     yes" in proc.stdout, proc.stderr
    code, doc, err = ctl.json("acquire", "ctl/7", "--ttl-ms", "1000", "--holder", "a", timeout="10")
    assert code == 0, err
    old = doc["token"]
    assert ctl("write", "ctl/7", "k", "one", "--token", str(old), timeout="10")[0] == 0
    # The lease lapses; worker b takes over (waiting for it server-side), then a's write is stale.
    code, doc, err = ctl.json(
        "acquire", "ctl/7", "--ttl-ms", "60000", "--holder", "b", "--wait-ms", "5000", timeout="10"
    )
    assert code == 0, err
    new = doc["token"]
    assert new > old
    proc = _run("--endpoints", ",".join(eps), "write", "ctl/7", "k", "late", "--token", str(old))
    assert proc.returncode == 3
    assert proc.stderr == f"fencingctl: refused: token {old} is stale for ctl/7 (high-water mark is {new})\n"
    request = json.dumps({"resource": "ctl/7", "key": "k", "value": "v", "token": -1})
    assert ctl("write", "--json", request)[0] == 2
    code, doc, _ = ctl.json("read", "ctl/7", "k", timeout="10")
    assert code == 0 and doc["value"] == "one"
    code, doc, _ = ctl.json("describe", "ctl/7", timeout="10")
    assert (doc["holder"], doc["token"], doc["hwm"]) == ("b", new, new)


def test_real_cluster_token_zero_is_invalid_argument_at_the_server(real_cluster):
    """What fencingctl refuses locally, the server refuses too (nothing is sent by the
    client, so this asks the server directly)."""
    from coordinator.api.v1 import fencing_pb2 as pb
    from coordinator.client.exceptions import InvalidArgument, from_rpc_error

    node = real_cluster.nodes[0]
    request = pb.WriteRequest(resource="ctl/zero", key="k", value=b"v", token=0, op_id=os.urandom(16))
    with pytest.raises(grpc.RpcError) as info:
        node.store.Write(request, timeout=5)
    err = from_rpc_error(info.value)
    assert isinstance(err, InvalidArgument) and err.field == "token"
    assert limits.TOKEN_MAX == 2**64 - 1


def test_a_closed_pipe_ends_fencingctl_quietly(cluster):
    """``fencingctl status | head -1``: the reader is gone before the table is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before fencingctl writes: its first write hits EPIPE, no race
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "coordinator.client.fencingctl", "--endpoints", ",".join(cluster.endpoints),
             "status"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == cli_ctl.EXIT_CLOSED_PIPE == 128 + signal.SIGPIPE
