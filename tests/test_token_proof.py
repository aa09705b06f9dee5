"""Signed token proofs end to end (DESIGN §6): a three-process cluster with a signing key
hands out proofs, and a guard at an external resource (a real SQLite file) uses them to
refuse a paused holder's delayed write and a token nobody issued.

Also: ``token_signing_key_file`` refusals at start, and ``fencingd keygen``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import msgpack
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from coordinator.client import FencingClient, guard, proof
from coordinator.server import config as config_mod
from testsupport.grpc_cluster import running_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fencingd(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", *argv],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    private, public = base / "signing.pem", base / "signing.pub"
    proc = _fencingd("keygen", "--private-key", str(private), "--public-key", str(public))
    assert proc.returncode == 0, proc.stderr
    return private, public


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request, keys):
    base = tmp_path_factory.mktemp("proofs")
    yield from running_cluster(str(base), request, settings={"token_signing_key_file": str(keys[0])})


@pytest.fixture
def store(tmp_path):
    """The external resource: a SQLite table of orders, guarded by its own hwm table."""
    conn = sqlite3.connect(str(tmp_path / "orders.db"), isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, state TEXT NOT NULL, token INTEGER NOT NULL)")
    yield conn
    conn.close()


def test_a_paused_holders_delayed_write_is_refused_at_the_external_guard(cluster, keys, store):
    verifier = proof.ProofVerifier.from_files(str(keys[1]))
    g = guard.SqliteGuard(store, verifier)
    g.ensure_schema()
    endpoints = [n.api_address for n in cluster.nodes]

    def put(lease_proof, state: str) -> None:
        with g.fenced("orders/7", lease_proof) as cur:
            cur.execute("INSERT INTO orders VALUES ('o7', ?, 0) ON CONFLICT(id) DO UPDATE SET state = excluded.state",
                        (state,))

    def state() -> str:
        return store.execute("SELECT state FROM orders WHERE id = 'o7'").fetchone()[0]

    with FencingClient(endpoints) as a, FencingClient(endpoints) as b:
        first = a.acquire("orders/7", holder="a", ttl_ms=60_000)
        assert first.token_proof, "a cluster with a signing key returns a proof"
        assert verifier.verify(first.token_proof, resource="orders/7").token == first.token
        put(first.token_proof, "paid")
        a.release("orders/7", first.token)  # A "pauses"; its lease is gone

        second = b.acquire("orders/7", holder="b", ttl_ms=60_000)
        assert second.token > first.token
        put(second.token_proof, "shipped")
        put(second.token_proof, "delivered")  # the same epoch writes again

        with pytest.raises(guard.StaleToken) as stale:  # A wakes up and writes late
            put(first.token_proof, "refunded")
        assert stale.value.hwm == second.token and stale.value.token == first.token
        assert state() == "delivered"

        # A made-up token above everything: the old proof with its token raised.
        fields = msgpack.unpackb(second.token_proof)
        fields[3] = second.token + 1_000_000
        with pytest.raises(proof.InvalidProof) as forged:
            put(msgpack.packb(fields), "stolen")
        assert forged.value.reason == "bad_signature"
        with pytest.raises(proof.InvalidProof) as elsewhere:  # a real proof for another resource
            put(b.acquire("orders/8", holder="b", ttl_ms=60_000).token_proof, "stolen")
        assert elsewhere.value.reason == "wrong_resource"
        assert state() == "delivered" and g.hwm("orders/7") == second.token


def test_a_retried_acquire_returns_the_same_proof(cluster, keys):
    verifier = proof.ProofVerifier.from_files(str(keys[1]))
    op_id = os.urandom(16)
    with FencingClient([n.api_address for n in cluster.nodes]) as client:
        first = client.acquire("retry/1", holder="r", ttl_ms=60_000, op_id=op_id)
        again = client.acquire("retry/1", holder="r", ttl_ms=60_000, op_id=op_id)
    assert (again.token, again.token_proof) == (first.token, first.token_proof)
    assert verifier.verify(again.token_proof).resource == "retry/1"


def test_fencingctl_prints_the_proof_in_text_form(cluster, keys):
    eps = ",".join(n.api_address for n in cluster.nodes)
    proc = subprocess.run([sys.executable, "-m", "coordinator.client.fencingctl", "--endpoints", eps, "-o", "json",
                           "acquire", "ctl/1", "--ttl-ms", "60000"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    stated = proof.ProofVerifier.from_files(str(keys[1])).verify(doc["token_proof"], resource="ctl/1")
    assert stated.token == doc["token"]


# -- refusals at start, keygen ----------------------------------------------------------------


def _build(tmp_path, key_path: str) -> config_mod.ServerConfig:
    return config_mod.build({"data_dir": str(tmp_path / "d"), "raft_address": "127.0.0.1:7000",
                             "members": ["127.0.0.1:7000=127.0.0.1:7100"],
                             "token_signing_key_file": key_path}, {})


def test_a_bad_signing_key_stops_the_member_at_start(tmp_path, keys):
    ec_key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "ec.pem").write_bytes(ec_key)
    (tmp_path / "junk.pem").write_text("not a key\n")
    cases = [
        (str(tmp_path / "missing.pem"), "cannot read"),
        (str(tmp_path / "junk.pem"), "is not PEM"),
        (str(tmp_path / "ec.pem"), "is not an Ed25519 key"),
        (str(keys[1]), "cannot be loaded"),  # the public half where the private one belongs
    ]
    for path, fragment in cases:
        with pytest.raises(config_mod.ConfigError) as caught:
            _build(tmp_path, path)
        message = str(caught.value)
        assert message.startswith("token_signing_key_file: ") and fragment in message, message
    assert _build(tmp_path, str(keys[0])).proof_signer() is not None


def test_keygen_never_overwrites_and_leaves_no_half_pair(tmp_path, keys):
    existing = tmp_path / "taken.pub"
    existing.write_text("keep me")
    private = tmp_path / "new.pem"
    proc = _fencingd("keygen", "--private-key", str(private), "--public-key", str(existing))
    assert proc.returncode == 1 and "cannot create" in proc.stderr
    assert existing.read_text() == "keep me" and not private.exists()
    assert os.stat(keys[0]).st_mode & 0o077 == 0, "the private key is readable by its owner only"
