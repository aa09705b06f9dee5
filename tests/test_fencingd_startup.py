"""``fencingd serve`` start-up on real processes: every failure is one line on stderr naming
the setting, a non-zero exit and no traceback; READY comes only once both listeners are bound;
``check-config`` and ``--version``; the JSON log format."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from testsupport import pki
from testsupport.grpc_cluster import write_toml
from testsupport.supervisor import DEFAULT_HOSTS, pick_ports

HOST = DEFAULT_HOSTS[0]
# Not on any machine (TEST-NET-1, RFC 5737): binding it fails with EADDRNOTAVAIL.
NOT_HERE = "192.0.2.1"
# A failing start exits within seconds; a member that hangs instead fails the test here.
START_TIMEOUT_S = 60


def fencingd(*argv: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", *argv],
                          capture_output=True, text=True, timeout=timeout)


def member(tmp_path, **settings) -> tuple[str, dict]:
    """A one-member cluster's config file (it is its own quorum) and its values."""
    raft_port, api_port = pick_ports((HOST,))
    values = {"data_dir": str(tmp_path / "data"), "raft_address": f"{HOST}:{raft_port}",
              "members": [f"{HOST}:{raft_port}={HOST}:{api_port}"], "cpu_affinity": "off",
              "log_level": "WARNING",  # WARNING: the failure is then the only line
              "initial_cluster_state": "new",  # a brand-new cluster: it may bootstrap (alone)
              **settings}
    path = str(tmp_path / "member.toml")
    write_toml(path, values)
    return path, values


def started(path: str, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    """``fencingd serve`` running; killed after START_TIMEOUT_S, so a read of its output that
    waits for a line that never comes ends at EOF instead of hanging the run."""
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", path],
                            stdout=subprocess.PIPE, stderr=stderr, text=True)
    guard = threading.Timer(START_TIMEOUT_S, proc.kill)
    guard.daemon = True
    guard.start()
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=START_TIMEOUT_S)


def assert_one_line_naming(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode not in (0, None), proc.stderr
    assert "READY" not in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def listening_socket(host: str) -> socket.socket:
    taken = socket.socket()
    taken.bind((host, 0))
    taken.listen()
    return taken


# -- addresses ------------------------------------------------------------------------------


def test_an_api_port_in_use_is_one_line_naming_listen_address(tmp_path):
    with listening_socket(HOST) as taken:
        address = f"{HOST}:{taken.getsockname()[1]}"
        path, _ = member(tmp_path, listen_address=address)
        proc = fencingd("serve", "--config", path)
    assert_one_line_naming(proc, f"listen_address {address}", "in use")


def test_an_api_port_in_use_without_listen_address_names_members(tmp_path):
    with listening_socket(HOST) as taken:
        raft_port, _ = pick_ports((HOST,))
        api = f"{HOST}:{taken.getsockname()[1]}"
        proc = fencingd("serve", "--data-dir", str(tmp_path / "d"), "--raft-address", f"{HOST}:{raft_port}",
                        "--members", f"{HOST}:{raft_port}={api}", "--cpu-affinity", "off", "--log-level", "WARNING")
    assert_one_line_naming(proc, f"members: this member's API address {api}", "in use")


def test_an_api_address_not_on_this_machine_is_one_line_naming_listen_address(tmp_path):
    # insecure_api: the address is not loopback; ERROR: its start-up warning is not the line tested
    path, _ = member(tmp_path, listen_address=f"{NOT_HERE}:7100", insecure_api=True, log_level="ERROR")
    assert_one_line_naming(fencingd("serve", "--config", path), f"listen_address {NOT_HERE}:7100", "assign")


def test_a_raft_port_in_use_is_one_line_naming_raft_address_and_no_ready(tmp_path):
    with listening_socket(HOST) as taken:
        raft = f"{HOST}:{taken.getsockname()[1]}"
        _, api_port = pick_ports((HOST,))
        proc = fencingd("serve", "--data-dir", str(tmp_path / "d"), "--raft-address", raft,
                        "--members", f"{raft}={HOST}:{api_port}", "--cpu-affinity", "off", "--log-level", "WARNING")
    assert_one_line_naming(proc, f"raft_address {raft}", "in use")


def test_a_raft_address_not_on_this_machine_is_one_line_naming_raft_address(tmp_path):
    _, api_port = pick_ports((HOST,))
    raft = f"{NOT_HERE}:7000"
    proc = fencingd("serve", "--data-dir", str(tmp_path / "d"), "--raft-address", raft, "--insecure-peer-transport",
                    "true", "--members", f"{raft}={HOST}:{api_port}", "--cpu-affinity", "off",
                    "--log-level", "ERROR")  # ERROR: no insecure_peer_transport warning before the line
    assert_one_line_naming(proc, f"raft_address {raft}", "assign")


def test_ready_comes_after_both_listeners_are_bound(tmp_path):
    path, values = member(tmp_path)
    proc = started(path)
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("READY "), ready
        for address in (values["raft_address"], values["members"][0].split("=")[1]):
            host, port = address.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=5).close()  # no retry: bound already
    finally:
        stop(proc)


# -- TLS files ----------------------------------------------------------------------------------


def _cert(key, *, days_from: int, days_to: int) -> bytes:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "member")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=days_from))
            .not_valid_after(now + datetime.timedelta(days=days_to)).sign(key, pki.hashes.SHA256()))
    return pki.pem_cert(cert)


def _tls_case(tmp_path, case: str) -> tuple[dict, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert, key_file, cert_file = tmp_path / "c.pem", str(tmp_path / "k.pem"), str(tmp_path / "c.pem")
    pki.write_file(key_file, pki.pem_key(key))
    cert.write_bytes(_cert(key, days_from=-1, days_to=30))
    if case == "unreadable cert":
        cert_file = str(tmp_path / "missing.pem")
        return {"tls_cert_file": cert_file, "tls_key_file": key_file}, f"tls_cert_file: cannot read {cert_file}"
    if case == "public key as cert":
        cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
        return {"tls_cert_file": cert_file, "tls_key_file": key_file}, "tls_cert_file:"
    if case == "expired":
        cert.write_bytes(_cert(key, days_from=-30, days_to=-1))
        return {"tls_cert_file": cert_file, "tls_key_file": key_file}, "tls_cert_file:"
    if case == "key of another certificate":
        pki.write_file(key_file, pki.pem_key(ec.generate_private_key(ec.SECP256R1())))
        return {"tls_cert_file": cert_file, "tls_key_file": key_file}, "tls_key_file:"
    assert case == "client CA not a certificate"
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.pem_key(key))
    return ({"tls_cert_file": cert_file, "tls_key_file": key_file, "tls_client_ca_file": str(ca)},
            "tls_client_ca_file:")


@pytest.mark.parametrize("case", ["unreadable cert", "public key as cert", "expired", "key of another certificate",
                                  "client CA not a certificate"])
def test_bad_tls_files_are_one_line_naming_the_setting(tmp_path, case):
    settings, fragment = _tls_case(tmp_path, case)
    path, _ = member(tmp_path, **settings)
    assert_one_line_naming(fencingd("serve", "--config", path), fragment)


# -- check-config and --version -----------------------------------------------------------------


def test_check_config_passes_a_good_file_and_binds_nothing(tmp_path):
    path, values = member(tmp_path)
    proc = fencingd("check-config", path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{path}: ok\n" and proc.stderr == ""
    assert not os.path.exists(values["data_dir"])  # checked, not started


def test_check_config_refuses_a_bad_file_in_one_line_naming_the_key(tmp_path):
    path, _ = member(tmp_path, grpc_threads=0)
    proc = fencingd("check-config", path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "grpc_threads: must be > 0" in proc.stderr
    secret = str(tmp_path / "no-such-secret")
    path, _ = member(tmp_path, raft_secret_file=secret)
    proc = fencingd("check-config", path)
    assert proc.returncode == 2 and f"raft_secret_file: cannot read {secret}" in proc.stderr
    assert fencingd("check-config", "--values-only", path).returncode == 0  # the file is not read


@pytest.mark.parametrize("command", ["coordinator.server.fencingd", "coordinator.client.fencingctl"])
def test_version_on_both_commands(command):
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", command, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{command.rsplit('.', 1)[1]} {version('fencing-coordinator')}\n"


# -- the JSON log format ---------------------------------------------------------------------


def test_json_logs_are_one_object_per_line_and_say_who_leads(tmp_path):
    path, values = member(tmp_path, log_format="json", log_level="INFO")
    proc = started(path, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith("READY ")
        lines = []
        for line in proc.stderr:  # the member is its own quorum: it elects itself
            lines.append(json.loads(line))
            if lines[-1]["msg"].startswith("raft: leader changed"):
                break
    finally:
        stop(proc)
    for doc in lines:
        assert {"ts", "level", "logger", "msg"} <= set(doc), doc
        datetime.datetime.fromisoformat(doc["ts"])
    change = lines[-1]
    assert change["logger"].startswith("coordinator.raft") and change["level"] == "INFO"
    assert change["msg"].startswith(f"raft: leader changed: none -> {values['raft_address']}"), change


# -- a data dir that belongs to another member -----------------------------------------------


def _data_dir_of(values: dict, member_id: str) -> str:
    """``values``' data dir, holding the identity of ``member_id`` (as that member's start made it)."""
    from coordinator.raft import identity

    os.makedirs(values["data_dir"])
    identity.write(values["data_dir"], identity.Identity(member_id=member_id, incarnation=12345))
    return os.path.join(values["data_dir"], identity.IDENTITY_NAME)


def test_another_members_data_dir_is_refused_in_one_line_by_serve_and_check_config(tmp_path):
    path, values = member(tmp_path)  # alone in members: it is m1
    identity_file = _data_dir_of(values, "m2")
    with open(identity_file, "rb") as f:
        before = f.read()
    for argv in (("serve", "--config", path), ("check-config", path)):
        proc = fencingd(*argv)
        assert_one_line_naming(proc, "configuration error: data_dir", values["data_dir"],
                               "belongs to member m2", "this member is m1 (member_id")
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout  # 2: the unit does not restart
    with open(identity_file, "rb") as f:
        assert f.read() == before
    assert sorted(os.listdir(values["data_dir"])) == ["member.identity"]  # nothing started on it
    # --values-only checks a config meant for another machine: this one's data dir is not read.
    assert fencingd("check-config", "--values-only", path).returncode == 0
    # The same dir is fine for the member it belongs to.
    path, _ = member(tmp_path, member_id="m2")
    proc = fencingd("check-config", path)
    assert proc.returncode == 0 and proc.stdout == f"{path}: ok\n", proc.stderr


def test_a_damaged_identity_file_is_refused_in_one_line(tmp_path):
    path, values = member(tmp_path)
    identity_file = _data_dir_of(values, "m1")
    with open(identity_file, "w", encoding="utf-8") as f:
        f.write('{"format": 1, "member_id": "m1"')
    for argv in (("serve", "--config", path), ("check-config", path)):
        proc = fencingd(*argv)
        assert_one_line_naming(proc, f"configuration error: data_dir: {identity_file} is damaged")
        assert proc.returncode == 2
