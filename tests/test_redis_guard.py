"""RedisGuard's own concerns on a real redis-server the tests start (the redis_server fixture,
testsupport.store_servers): every mutation kind, the script sent once and sent again after
NOSCRIPT, keys outside the resource's hash slot, checks that must run before the script's
first write (a wrong type, an INCRBY overflow), a decoding client, and a machine without
redis-server failing with how to install it. The contract shared with every guard is in
test_guard_conformance.py.
"""

# First: without redis-py this import fails with how to install it (the [redis] extra).
import pytest
import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from redis.crc import key_slot

from coordinator.client.proof import TOKEN_MAX, ProofSigner, ProofVerifier
from coordinator.client.redis_guard import (
    REDIS_ARGS_PER_MUTATION_MAX,
    REDIS_MUTATIONS_PER_CALL_MAX,
    Mutation,
    RedisGuard,
    StaleToken,
)
from testsupport import store_servers

KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])
R = "orders/7"


@pytest.fixture
def client(redis_server):
    c = redis_server.client(redis_server.new_database())
    yield c
    c.close()


@pytest.fixture
def guard(client):
    return RedisGuard(client, VERIFIER)


def k(name):
    return RedisGuard.key(R, name)


def test_every_mutation_kind_in_one_atomic_call(client, guard):
    client.set(k("gone"), "x")
    results = guard.apply(
        R, SIGNER.sign(R, 3),
        Mutation.set(k("state"), "packed"),
        Mutation.hset(k("order"), {"total": 42, "state": "packed"}),
        Mutation.delete(k("gone")),
        Mutation.incrby(k("count"), 5),
        Mutation.rpush(k("queue"), "a", "b"),
        Mutation.lpush(k("stack"), "z"),
        Mutation.xadd(k("events"), {"state": "packed"}),
    )
    assert results[:6] == [b"OK", 2, 1, 5, 2, 1]
    assert client.xrange(k("events")) == [(results[6], {b"state": b"packed"})]
    assert client.get(k("state")) == b"packed" and client.hgetall(k("order")) == {b"total": b"42", b"state": b"packed"}
    assert not client.exists(k("gone")) and client.lrange(k("queue"), 0, -1) == [b"a", b"b"]
    assert (guard.hwm(R), client.get(RedisGuard.hwm_key(R))) == (3, b"00000000000000000003")
    assert guard.incrby(R, SIGNER.sign(R, 3), k("count"), -7) == -2
    assert guard.set(R, SIGNER.sign(R, 4), k("state"), "shipped") == b"OK"
    with pytest.raises(StaleToken) as info:
        guard.set(R, SIGNER.sign(R, 3), k("state"), "cancelled")
    assert (info.value.token, info.value.hwm) == (3, 4)
    assert client.get(k("state")) == b"shipped"


def _script_loads(client):
    return int(client.info("commandstats").get("cmdstat_script|load", {}).get("calls", 0))


def test_the_script_is_loaded_once_and_again_after_noscript(client, guard):
    before = _script_loads(client)
    for n in range(5):
        guard.rpush(R, SIGNER.sign(R, 1), k("log"), n)
    stats = client.info("commandstats")
    assert _script_loads(client) - before <= 1  # the first EVALSHA's NOSCRIPT, once per server
    assert stats["cmdstat_evalsha"]["calls"] >= 5 and "cmdstat_eval" not in stats
    client.script_flush()  # as after a restart or a failover to a replica that never saw it
    guard.rpush(R, SIGNER.sign(R, 1), k("log"), 5)
    assert _script_loads(client) - before <= 2
    assert client.lrange(k("log"), 0, -1) == [b"0", b"1", b"2", b"3", b"4", b"5"]


@pytest.mark.parametrize("key", ["orders/7:state", "{orders/8}:state", "{orders/7:state", "plain"])
def test_a_key_outside_the_resources_slot_is_refused_before_anything_is_sent(client, guard, key):
    assert key_slot(key.encode()) != key_slot(RedisGuard.hwm_key(R).encode())
    with pytest.raises(ValueError, match="hash slot"):
        guard.set(R, SIGNER.sign(R, 1), key, "x")
    assert client.dbsize() == 0


def test_any_key_whose_hash_tag_is_the_resource_is_in_its_slot(client, guard):
    guard.set(R, SIGNER.sign(R, 1), "prefix:{orders/7}:state", "x")  # the tag need not lead
    assert client.get("prefix:{orders/7}:state") == b"x"


def test_bad_calls_are_refused_before_anything_is_sent(client, guard):
    proof = SIGNER.sign(R, 1)
    with pytest.raises(ValueError, match="hwm key"):
        guard.set(R, proof, RedisGuard.hwm_key(R), "00000000000000000009")
    with pytest.raises(ValueError, match="twice"):
        guard.apply(R, proof, Mutation.rpush(k("a"), 1), Mutation.rpush(k("a"), 2))
    with pytest.raises(ValueError, match="at least one"):
        guard.apply(R, proof)
    with pytest.raises(ValueError, match=str(REDIS_MUTATIONS_PER_CALL_MAX)):
        guard.apply(R, proof, *[Mutation.set(k(str(i)), i) for i in range(REDIS_MUTATIONS_PER_CALL_MAX + 1)])
    with pytest.raises(ValueError, match=str(REDIS_ARGS_PER_MUTATION_MAX)):
        guard.rpush(R, proof, k("a"), *range(REDIS_ARGS_PER_MUTATION_MAX + 1))
    for bad in (2**63, -(2**63) - 1, 1.5, "1", True):
        with pytest.raises(ValueError, match="incrby"):
            guard.incrby(R, proof, k("n"), bad)
    with pytest.raises(TypeError, match="Mutation"):
        guard.apply(R, proof, ("SET", k("a"), "x"))
    with pytest.raises(TypeError, match="redis.Redis"):
        RedisGuard("localhost:6379", VERIFIER)
    assert client.dbsize() == 0
    # The largest call that is allowed goes through whole.
    guard.apply(R, proof, *[Mutation.set(k(str(i)), i) for i in range(REDIS_MUTATIONS_PER_CALL_MAX - 1)],
                Mutation.rpush(k("a"), *range(REDIS_ARGS_PER_MUTATION_MAX)))
    assert client.llen(k("a")) == REDIS_ARGS_PER_MUTATION_MAX


@pytest.mark.parametrize(
    "value, amount, ok",
    [(str(2**63 - 2), 1, True), (str(2**63 - 1), 1, False), (str(-(2**63) + 1), -1, True),
     (str(-(2**63)), -1, False), (str(2**63 - 1), -(2**63), True), ("999999999", 1, True),
     ("-1000000000", 999999999, True), ("1.5", 1, False), ("007", 1, False), ("", 1, False)],
)
def test_an_incrby_that_redis_would_refuse_is_refused_before_any_write(client, guard, value, amount, ok):
    """Redis keeps the writes a failing script made before it failed, so the script must find
    an INCRBY's failure (a non-integer value, a 64-bit overflow) before its first write."""
    client.set(k("n"), value)
    call = (Mutation.rpush(k("log"), "x"), Mutation.incrby(k("n"), amount))
    if ok:
        assert guard.apply(R, SIGNER.sign(R, 2), *call)[1] == int(value) + amount
        assert client.get(k("n")) == str(int(value) + amount).encode()
        return
    with pytest.raises(redis.ResponseError, match="nothing written"):
        guard.apply(R, SIGNER.sign(R, 2), *call)
    assert (client.get(k("n")), client.exists(k("log")), guard.hwm(R)) == (value.encode(), 0, None)
    client.set(k("n"), 1)  # and Redis itself agrees that it would have failed
    with pytest.raises(redis.ResponseError):
        client.set(k("n"), value)
        client.incrby(k("n"), amount)


@pytest.mark.parametrize("held, mutation", [("hash", Mutation.rpush), ("list", Mutation.xadd),
                                            ("stream", Mutation.hset), ("list", Mutation.incrby)])
def test_a_key_of_the_wrong_type_is_refused_before_any_write(client, guard, held, mutation):
    {"hash": lambda: client.hset(k("x"), "f", "v"), "list": lambda: client.rpush(k("x"), "v"),
     "stream": lambda: client.xadd(k("x"), {"f": "v"})}[held]()
    arg = {"rpush": ("v",), "xadd": ({"f": "v"},), "hset": ({"f": "v"},), "incrby": (1,)}[mutation.__name__]
    with pytest.raises(redis.ResponseError, match="WRONGTYPE.*nothing written"):
        guard.apply(R, SIGNER.sign(R, 9), Mutation.set(k("first"), "x"), mutation(k("x"), *arg))
    assert (client.exists(k("first")), guard.hwm(R)) == (0, None)


def test_wait_for_replicas_counts_the_replicas_that_have_the_writes(client, guard):
    guard.set(R, SIGNER.sign(R, 1), k("state"), "x")
    assert guard.wait_for_replicas(0, 100) == 0  # a server without replicas: none, at once


def test_a_damaged_hwm_key_stops_the_guard(client, guard):
    client.set(RedisGuard.hwm_key(R), "12")  # not 20 digits: something else wrote it
    with pytest.raises(redis.ResponseError, match="damaged"):
        guard.set(R, SIGNER.sign(R, 99), k("state"), "x")
    with pytest.raises(ValueError, match="damaged"):
        guard.hwm(R)
    assert not client.exists(k("state"))


def test_a_decoding_client_works_the_same(redis_server):
    client = redis_server.client(redis_server.new_database(), decode_responses=True)
    guard = RedisGuard(client, None)
    assert guard.set(R, TOKEN_MAX, k("state"), "x") == "OK"
    assert guard.hwm(R) == TOKEN_MAX
    with pytest.raises(StaleToken) as info:
        guard.set(R, TOKEN_MAX - 1, k("state"), "y")
    assert info.value.hwm == TOKEN_MAX and client.get(k("state")) == "x"
    client.close()


def test_a_machine_without_redis_server_fails_with_how_to_install_it(monkeypatch, tmp_path):
    """Never a skip: without the binary the fixture fails with this line."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(store_servers.os, "access", lambda path, mode: False)
    with pytest.raises(store_servers.ServerMissing, match=r"apt-get install -y redis-server"):
        store_servers.RedisServer()
    with pytest.raises(store_servers.ServerMissing, match=r"apt-get install -y mariadb-server"):
        store_servers.MariaDBServer()


@pytest.fixture(scope="module")
def cluster_node(redis_server):  # redis_server first: it checks the binary and the driver
    node = store_servers.RedisClusterNode()
    try:
        node.start()
        yield node
    finally:
        node.stop()


def test_on_redis_cluster_a_resources_keys_share_the_scripts_slot(cluster_node):
    """Redis Cluster runs a script only if all its keys are in one slot (else a CROSSSLOT error), which
    the {resource} hash tag gives; the guard refuses any other key before sending."""
    from redis.cluster import RedisCluster

    cluster = RedisCluster(host="127.0.0.1", port=cluster_node.port)
    try:
        guard = RedisGuard(cluster, VERIFIER)
        guard.apply(R, SIGNER.sign(R, 5), Mutation.set(k("state"), "packed"), Mutation.incrby(k("count"), 1))
        assert (guard.hwm(R), cluster.get(k("state")), cluster.get(k("count"))) == (5, b"packed", b"1")
        with pytest.raises(StaleToken):
            guard.set(R, SIGNER.sign(R, 4), k("state"), "cancelled")
        with pytest.raises(ValueError, match="hash slot"):
            guard.set(R, SIGNER.sign(R, 5), "orders/7:state", "x")
        # What the guard's check spares the caller: the server refuses a script across slots.
        with cluster_node.client() as plain, pytest.raises(redis.ResponseError, match="same slot"):  # CROSSSLOT
            plain.eval("return 1", 2, k("state"), "orders/7:state")
        assert cluster.get(k("state")) == b"packed"
    finally:
        cluster.close()
