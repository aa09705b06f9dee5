"""TLS on the gRPC API: a three-process cluster serving mutual TLS, reached by the client
library, fencingctl and the health probe with certificates made here (cryptography)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from coordinator.server import config as config_mod
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import FencingClient
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import DEFAULT_HOSTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool, ips=()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ips:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]), critical=False
        )
    return builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    """A CA, a server certificate for the test hosts, a client certificate: file paths."""
    out = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key, None, None, ca=True)
    files = {"ca": ca.public_bytes(serialization.Encoding.PEM)}
    for name, ips in (("server", DEFAULT_HOSTS), ("client", ())):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(name, key, ca.subject, ca_key, ca=False, ips=ips)
        files[f"{name}_cert"] = cert.public_bytes(serialization.Encoding.PEM)
        files[f"{name}_key"] = _pem_key(key)
    paths = {}
    for name, data in files.items():
        path = out / f"{name}.pem"
        path.write_bytes(data)
        paths[name] = str(path)
    return paths


def client_credentials(pki, *, with_cert: bool = True) -> grpc.ChannelCredentials:
    read = lambda name: open(pki[name], "rb").read()  # noqa: E731
    if not with_cert:
        return grpc.ssl_channel_credentials(read("ca"))
    return grpc.ssl_channel_credentials(read("ca"), read("client_key"), read("client_cert"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request, pki):
    settings = {"tls_cert_file": pki["server_cert"], "tls_key_file": pki["server_key"],
                "tls_client_ca_file": pki["ca"]}
    yield from running_cluster(str(tmp_path_factory.mktemp("tls")), request, settings=settings,
                               credentials=client_credentials(pki))


def test_the_client_library_works_over_mutual_tls(cluster, pki):
    endpoints = [n.api_address for n in cluster.nodes]
    with FencingClient(endpoints, credentials=client_credentials(pki)) as client:
        lease = client.acquire("tls/1", holder="t", ttl_ms=60_000)
        assert client.write("tls/1", "k", b"v", token=lease.token).version >= 1
        assert client.read("tls/1", "k").value == b"v"


@pytest.mark.parametrize("how", ["plaintext", "tls without a client certificate"])
def test_a_client_without_the_right_credentials_gets_nowhere(cluster, pki, how):
    node = cluster.nodes[0]
    channel = (grpc.insecure_channel(node.api_address) if how == "plaintext"
               else grpc.secure_channel(node.api_address, client_credentials(pki, with_cert=False)))
    with channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.ClusterStub(channel).Status(pb.StatusRequest(), timeout=RPC_TIMEOUT_S)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def _run(module: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_fencingctl_and_the_health_probe_take_certificate_files(cluster, pki):
    endpoints = ",".join(n.api_address for n in cluster.nodes)
    tls = ["--ca-file", pki["ca"], "--cert-file", pki["client_cert"], "--key-file", pki["client_key"]]
    ok = _run("coordinator.client.fencingctl", "--endpoints", endpoints, *tls, "--timeout", "10", "status")
    assert ok.returncode == 0 and "has_quorum" in ok.stdout, ok.stderr
    plain = _run("coordinator.client.fencingctl", "--endpoints", endpoints, "--timeout", "2", "status")
    assert plain.returncode == 4, plain.stderr  # unavailable: nothing answers plaintext
    address = cluster.nodes[0].api_address
    assert _run("coordinator.server.fencingd", "health", "--address", address, *tls).returncode == 0
    assert _run("coordinator.server.fencingd", "health", "--address", address).returncode == 1


def test_tls_settings_are_checked_at_start(tmp_path, pki):
    base = {"data_dir": str(tmp_path / "d"), "raft_address": "127.0.0.1:7000",
            "members": ["127.0.0.1:7000=127.0.0.1:7100"]}
    not_pem = tmp_path / "x.pem"
    not_pem.write_text("hello")
    for overrides, fragment in (
        ({"tls_cert_file": pki["server_cert"]}, "give both"),
        ({"tls_client_ca_file": pki["ca"]}, "give both"),
        ({"tls_cert_file": pki["server_cert"], "tls_key_file": str(tmp_path / "missing")}, "tls_key_file: cannot read"),
        ({"tls_cert_file": str(not_pem), "tls_key_file": pki["server_key"]}, "tls_cert_file: " + str(not_pem) + " is not PEM"),
    ):
        with pytest.raises(config_mod.ConfigError) as caught:
            config_mod.build(base, overrides)
        assert fragment in str(caught.value)
    assert config_mod.build(base, {"tls_cert_file": pki["server_cert"], "tls_key_file": pki["server_key"]}).tls_files()
