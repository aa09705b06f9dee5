"""TLS on the gRPC API: a three-process cluster serving mutual TLS, reached by the client
library, fencingctl and the health probe with certificates made here (cryptography); and a
member whose certificate is replaced on SIGHUP while it serves."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys

import grpc
import pytest
from cryptography import x509

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import FencingClient
from coordinator.core import commands
from coordinator.server import config as config_mod
from testsupport import pki as pki_mod
from testsupport.grpc_cluster import RPC_TIMEOUT_S, running_cluster
from testsupport.supervisor import DEFAULT_HOSTS, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    """A CA, a server certificate for the test hosts, a client certificate: file paths."""
    out = tmp_path_factory.mktemp("pki")
    ca_key = pki_mod.new_key()
    ca = pki_mod.make_cert("test-ca", ca_key, ca=True)
    files = {"ca": pki_mod.pem_cert(ca)}
    for name, ips in (("server", DEFAULT_HOSTS), ("client", ())):
        key = pki_mod.new_key()
        files[f"{name}_cert"] = pki_mod.pem_cert(pki_mod.make_cert(name, key, ca, ca_key, ips=ips))
        files[f"{name}_key"] = pki_mod.pem_key(key)
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


def test_the_leader_raises_the_cluster_level_over_mutual_tls(cluster, pki):
    """The leader's LevelPoller asks every member's health service over the API's own TLS,
    presenting its certificate as mutual TLS asks: the level rises to what the build applies
    (DESIGN §8 "Rolling upgrades"), as it does over plaintext."""
    endpoints = [n.api_address for n in cluster.nodes]
    with FencingClient(endpoints, credentials=client_credentials(pki)) as client:
        status = wait_until(lambda: (lambda s: s if s.cluster_level == commands.ENTRY_LEVEL else None)(
            client.status()), 30, what=f"cluster level {commands.ENTRY_LEVEL}")
        assert status.entry_level == commands.ENTRY_LEVEL


@pytest.mark.parametrize("how", ["plaintext", "tls without a client certificate"])
def test_a_client_without_the_right_credentials_gets_nowhere(cluster, pki, how):
    node = cluster.nodes[0]
    channel = (grpc.insecure_channel(node.api_address) if how == "plaintext"
               else grpc.secure_channel(node.api_address, client_credentials(pki, with_cert=False)))
    with channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.ClusterStub(channel).Status(pb.StatusRequest(), timeout=RPC_TIMEOUT_S)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_failed_handshakes_add_nothing_to_the_process_log(cluster, pki):
    """Issue 26: the gRPC core logged a line (~220 B) for each failed TLS handshake, from anyone
    who reaches the port; fencingd keeps the core to its errors (GRPC_VERBOSITY)."""
    node = cluster.nodes[1]
    host, port = node.api_address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=pki["ca"])
    context.set_alpn_protocols(["h2"])
    before = os.path.getsize(node.log_path)
    for _ in range(50):
        with socket.create_connection((host, int(port)), timeout=RPC_TIMEOUT_S) as raw:
            try:  # no client certificate: the member ends the handshake (the read sees it)
                with context.wrap_socket(raw, server_hostname=host) as tls:
                    tls.sendall(b"x")
                    tls.recv(16)
            except (OSError, ssl.SSLError):
                pass
    with open(node.log_path, encoding="utf-8", errors="replace") as f:
        f.seek(before)
        added = f.read()
    assert "andshake" not in added, added[:2000]
    node.check_running()


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
    assert _run("coordinator.server.fencingd", "health", "--address", address).returncode == 2  # no TLS: no answer


def test_tls_settings_are_checked_at_start(tmp_path, pki):
    base = {"data_dir": str(tmp_path / "d"), "raft_address": "127.0.0.1:7000",
            "members": ["127.0.0.1:7000=127.0.0.1:7100"]}
    not_pem = tmp_path / "x.pem"
    not_pem.write_text("hello")
    for overrides, fragment in (
        ({"tls_cert_file": pki["server_cert"]}, "give both"),
        ({"tls_client_ca_file": pki["ca"]}, "give both"),
        ({"tls_cert_file": pki["server_cert"], "tls_key_file": str(tmp_path / "missing")}, "tls_key_file: cannot read"),
        ({"tls_cert_file": str(not_pem), "tls_key_file": pki["server_key"]},
         "tls_cert_file: " + str(not_pem) + " is not PEM"),
        ({"tls_cert_file": pki["server_cert"], "tls_key_file": pki["client_key"]}, "is not the private key of"),
        ({"tls_cert_file": pki["server_cert"], "tls_key_file": pki["server_key"],
          "tls_client_ca_file": pki["server_key"]},
         "tls_client_ca_file: " + pki["server_key"] + " holds no readable certificate"),
    ):
        with pytest.raises(config_mod.ConfigError) as caught:
            config_mod.build(base, overrides)
        assert fragment in str(caught.value)
    assert config_mod.build(base, {"tls_cert_file": pki["server_cert"], "tls_key_file": pki["server_key"]}).tls_files()


# -- SIGHUP: a new certificate without a restart ------------------------------------------------

# A SIGHUP is acted on within a fraction of a second; a slow machine gets far more.
RELOAD_TIMEOUT_S = 15.0


class ReloadPki:
    """Two server CAs (the certificate before and after the swap are signed by different ones, so
    a client trusting only the new CA proves the swap), a client CA and a client certificate."""

    def __init__(self, out, host: str):
        self.out, self.host = out, host
        self.client_ca_key = pki_mod.new_key()
        self.client_ca = pki_mod.make_cert("client-ca", self.client_ca_key, ca=True)
        client_key = pki_mod.new_key()
        self.files = {"client_ca": self.path("client-ca.pem"), "cert": self.path("server.pem"),
                      "key": self.path("server.key"), "client_cert": self.path("client.pem"),
                      "client_key": self.path("client.key")}
        pki_mod.write_file(self.files["client_ca"], pki_mod.pem_cert(self.client_ca))
        pki_mod.write_file(self.files["client_cert"], pki_mod.pem_cert(
            pki_mod.make_cert("client", client_key, self.client_ca, self.client_ca_key)))
        pki_mod.write_file(self.files["client_key"], pki_mod.pem_key(client_key))

    def path(self, name: str) -> str:
        return str(self.out / name)

    def server_identity(self, cn: str, dns=()):
        """A new CA and a server certificate it signed for the member's host: (ca PEM, cert, key)."""
        ca_key = pki_mod.new_key()
        ca = pki_mod.make_cert(f"{cn}-ca", ca_key, ca=True)
        key = pki_mod.new_key()
        return pki_mod.pem_cert(ca), pki_mod.make_cert(cn, key, ca, ca_key, ips=(self.host,), dns=dns), key

    def install(self, cert, key) -> None:
        pki_mod.write_file(self.files["key"], pki_mod.pem_key(key))
        pki_mod.write_file(self.files["cert"], pki_mod.pem_cert(cert))

    def channel_credentials(self, server_ca: bytes) -> grpc.ChannelCredentials:
        read = lambda name: open(self.files[name], "rb").read()  # noqa: E731
        return grpc.ssl_channel_credentials(server_ca, read("client_key"), read("client_cert"))


def served_certificate(address: str, reload_pki: ReloadPki):
    """The certificate a new TLS connection to ``address`` is shown (read, not verified)."""
    host, port = address.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # we only look at what is served; gRPC below verifies
    context.load_cert_chain(reload_pki.files["client_cert"], reload_pki.files["client_key"])
    with socket.create_connection((host, int(port)), timeout=RPC_TIMEOUT_S) as raw:
        with context.wrap_socket(raw) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def _status_ok(address: str, credentials: grpc.ChannelCredentials) -> bool:
    with grpc.secure_channel(address, credentials) as channel:
        try:
            pb_grpc.ClusterStub(channel).Status(pb.StatusRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            return False
    return True


@pytest.fixture
def reload_member(tmp_path, request):
    """One member (a quorum of its own: the swap is a per-process matter) serving mutual TLS
    from files the test replaces: (cluster, pki, the first server CA, its certificate)."""
    host = DEFAULT_HOSTS[0]
    reload_pki = ReloadPki(tmp_path, host)
    old_ca, old_cert, old_key = reload_pki.server_identity("server-before")
    reload_pki.install(old_cert, old_key)
    settings = {"tls_cert_file": reload_pki.files["cert"], "tls_key_file": reload_pki.files["key"],
                "tls_client_ca_file": reload_pki.files["client_ca"]}
    for cluster in running_cluster(str(tmp_path / "c"), request, hosts=(host,), settings=settings,
                                   credentials=reload_pki.channel_credentials(old_ca)):
        yield cluster, reload_pki, old_ca, old_cert


def test_sighup_replaces_the_api_certificate_without_a_restart(reload_member):
    cluster, reload_pki, old_ca, old_cert = reload_member
    node = cluster.nodes[0]
    pid = node.proc.pid
    assert served_certificate(node.api_address, reload_pki).serial_number == old_cert.serial_number
    # A channel connected before the swap: it keeps its connection, and keeps being served.
    node.status()

    new_ca, new_cert, new_key = reload_pki.server_identity("server-after", dns=("reloaded.test",))
    reload_pki.install(new_cert, new_key)
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: served_certificate(node.api_address, reload_pki).serial_number == new_cert.serial_number,
               RELOAD_TIMEOUT_S, what="the new certificate to be served")
    served = served_certificate(node.api_address, reload_pki)
    assert served.subject.rfc4514_string() == "CN=server-after"
    assert "reloaded.test" in served.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert _status_ok(node.api_address, reload_pki.channel_credentials(new_ca))  # verified by the new CA
    assert not _status_ok(node.api_address, reload_pki.channel_credentials(old_ca))
    node.status()  # the connection made before the swap still works
    assert node.alive and node.proc.pid == pid and cluster.answers(node)

    # Bad replacements: each is refused in one line naming the setting; the member keeps
    # serving the certificate it has.
    _, stray_cert, _ = reload_pki.server_identity("server-stray")
    for bad, fragment in (
        (lambda: pki_mod.write_file(reload_pki.files["cert"], pki_mod.pem_cert(stray_cert)),
         "tls_key_file: " + reload_pki.files["key"] + " is not the private key of the certificate"),
        (lambda: pki_mod.write_file(reload_pki.files["cert"], b"-----BEGIN CERTIFICATE-----\nnot base64\n"),
         "tls_cert_file: " + reload_pki.files["cert"] + " holds no readable certificate"),
        (lambda: os.remove(reload_pki.files["key"]), "tls_key_file: cannot read " + reload_pki.files["key"]),
    ):
        bad()
        os.kill(pid, signal.SIGHUP)
        wait_until(lambda fragment=fragment: fragment in _log(node), RELOAD_TIMEOUT_S,
                   what=f"a refusal naming {fragment!r}")
        assert served_certificate(node.api_address, reload_pki).serial_number == new_cert.serial_number
        assert _status_ok(node.api_address, reload_pki.channel_credentials(new_ca))
        reload_pki.install(new_cert, new_key)
    refusals = [line for line in _log(node).splitlines() if "kept the current API certificate" in line]
    assert len(refusals) == 3 and all("Traceback" not in line for line in refusals)
    assert "Traceback" not in _log(node)
    assert node.alive and node.proc.pid == pid and cluster.answers(node)


def _log(node) -> str:
    with open(node.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()
