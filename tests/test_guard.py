"""The guards' contract on real databases: the fencing rule, proof checks, rollback,
durability and two racing processes, each test on every store (testsupport.guard_stores):
SQLite in the sqlite3 module's default and autocommit modes, and PostgreSQL (a server the
tests start: the postgres_server fixture) with and without autocommit. Tests of one store's
own storage (SQLite's padded text, its pragmas) use that store alone; PostgreSQL's isolation
tests are in test_pg_guard.py.
"""

import multiprocessing
import queue
import sqlite3
import traceback

import msgpack
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.client import exceptions
from coordinator.client.guard import SqliteGuard, StaleToken
from coordinator.client.proof import TOKEN_MAX, InvalidProof, ProofSigner, ProofVerifier, to_text
from coordinator.core.names import ErrorReason
from testsupport import guard_stores
from testsupport.guard_stores import PostgresStore, SqliteStore

KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])
RESOURCE = "orders/7"
STORES = ["sqlite-default", "sqlite-autocommit", "postgres", "postgres-autocommit"]


def _store(kind, tmp_path, request):
    """A fresh empty database of ``kind`` (one of STORES)."""
    if kind.startswith("sqlite"):
        return SqliteStore(str(tmp_path / "store.db"), "" if kind == "sqlite-default" else None)
    dsn = request.getfixturevalue("postgres_server").new_database()
    return PostgresStore(dsn, autocommit=kind == "postgres-autocommit")


def _write(store, guard, token, resource=RESOURCE, proof=None):
    """One fenced write of ``token``, signed for ``resource`` unless ``proof`` is given."""
    guard_stores.write(store, guard, resource, token, SIGNER.sign(resource, token) if proof is None else proof)


def _written(store, conn, resource=RESOURCE):
    return guard_stores.written(store, conn, resource)


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    return _store(request.param, tmp_path, request)


@pytest.fixture(params=["sqlite-default", "sqlite-autocommit"])
def sqlite_store(request, tmp_path):
    return _store(request.param, tmp_path, request)


@pytest.fixture
def conn(store):
    c = store.connect()
    yield c
    c.close()


@pytest.fixture
def guard(store, conn):
    return guard_stores.setup(store, conn, VERIFIER)


# -- the rule -------------------------------------------------------------------------------


def test_first_write_creates_the_hwm(store, conn, guard):
    assert guard.hwm(RESOURCE) is None
    _write(store, guard, 5)
    assert guard.hwm(RESOURCE) == 5
    assert _written(store, conn) == [5]
    assert not store.in_transaction(conn)  # committed


def test_equal_token_writes_many_times(store, conn, guard):
    _write(store, guard, 5)
    _write(store, guard, 5)
    _write(store, guard, 5)
    assert guard.hwm(RESOURCE) == 5
    assert _written(store, conn) == [5, 5, 5]


def test_higher_token_raises_hwm_then_old_token_is_stale_and_not_applied(store, conn, guard):
    _write(store, guard, 5)
    _write(store, guard, 6)
    assert guard.hwm(RESOURCE) == 6
    body_ran = False
    with pytest.raises(StaleToken) as info:
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)) as cur:
            body_ran = True
            cur.execute(f"INSERT INTO writes (resource, token) VALUES ({store.param}, '5')", (RESOURCE,))
    assert not body_ran
    assert (info.value.resource, info.value.token, info.value.hwm) == (RESOURCE, 5, 6)
    assert "stale" in str(info.value) and "5" in str(info.value) and "6" in str(info.value)
    assert _written(store, conn) == [5, 6]
    assert guard.hwm(RESOURCE) == 6
    assert not store.in_transaction(conn)  # rolled back, the connection is free


def test_the_guards_stale_token_is_the_clients_so_one_except_catches_both(store, guard):
    # A service that writes through the coordinator and through a guard handles a fenced
    # holder in one place: the guard raises the very class the client raises.
    _write(store, guard, 6)
    with pytest.raises(exceptions.StaleToken) as info:
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)):
            pass
    refusal = info.value
    assert type(refusal) is exceptions.StaleToken and isinstance(refusal, exceptions.Refused)
    assert (refusal.code, refusal.reason, refusal.metadata) == (None, ErrorReason.STALE_TOKEN, {"hwm": "6"})
    assert refusal.category == "refused"


def test_an_invalid_proof_is_in_the_clients_exception_tree_too(store, guard):
    # One tree for the client and the guards: ``except FencingError`` catches a guard's refusal
    # of a forged proof as well; ValueError still catches it, as it did before.
    forged = ProofSigner(Ed25519PrivateKey.generate()).sign(RESOURCE, 5)
    with pytest.raises(exceptions.FencingError) as info:
        _write(store, guard, 5, proof=forged)
    refusal = info.value
    assert type(refusal) is InvalidProof is exceptions.InvalidProof
    assert isinstance(refusal, exceptions.Refused) and isinstance(refusal, ValueError)
    assert (refusal.reason, refusal.category, refusal.code) == ("unknown_key", "refused", None)
    assert "does not trust" in str(refusal)
    assert guard.hwm(RESOURCE) is None


def test_resources_are_fenced_independently(store, conn, guard):
    _write(store, guard, 9, resource="a")
    _write(store, guard, 2, resource="b")
    assert (guard.hwm("a"), guard.hwm("b")) == (9, 2)
    with pytest.raises(StaleToken):
        _write(store, guard, 1, resource="b")


def test_sqlite_stores_the_hwm_as_padded_text_in_number_order(sqlite_store):
    """9 then 10: as unpadded text "10" < "9"; the guard must still see 10 as higher. And
    2**64-1, beyond SQLite's signed INTEGER, is stored exactly, as its 20 digits."""
    conn = sqlite_store.connect()
    guard = guard_stores.setup(sqlite_store, conn, VERIFIER)
    _write(sqlite_store, guard, 9)
    _write(sqlite_store, guard, 10)
    assert guard.hwm(RESOURCE) == 10
    with pytest.raises(StaleToken):
        _write(sqlite_store, guard, 9)
    assert conn.execute("SELECT hwm FROM fencing_hwm").fetchall() == [("00000000000000000010",)]
    _write(sqlite_store, guard, TOKEN_MAX)
    assert conn.execute("SELECT hwm FROM fencing_hwm").fetchone() == (str(TOKEN_MAX),)
    conn.close()


def test_uint64_max_token_and_tokens_above_2_63(store, conn, guard):
    _write(store, guard, 2**63 - 1)
    _write(store, guard, 2**63)  # above SQLite's INTEGER and PostgreSQL's bigint
    assert guard.hwm(RESOURCE) == 2**63
    with pytest.raises(StaleToken):
        _write(store, guard, 2**63 - 1)
    _write(store, guard, TOKEN_MAX)
    assert guard.hwm(RESOURCE) == TOKEN_MAX
    with pytest.raises(StaleToken) as info:
        _write(store, guard, 2**63)
    assert info.value.hwm == TOKEN_MAX
    assert _written(store, conn) == [2**63 - 1, 2**63, TOKEN_MAX]


# -- proofs ---------------------------------------------------------------------------------


def _proof_other_key(token):
    return ProofSigner(Ed25519PrivateKey.generate()).sign(RESOURCE, token)


def _proof_edited_token(token):
    fields = msgpack.unpackb(SIGNER.sign(RESOURCE, 5), raw=False)
    fields[3] = token
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    "forge, reason",
    [(_proof_other_key, "unknown_key"), (_proof_edited_token, "bad_signature")],
    ids=["other-key", "edited-token"],
)
def test_never_issued_token_is_refused_and_changes_nothing(store, conn, guard, forge, reason):
    """A huge made-up token would lock real holders out; without a valid proof it changes nothing."""
    _write(store, guard, 5)
    with pytest.raises(InvalidProof) as info:
        _write(store, guard, TOKEN_MAX, proof=forge(TOKEN_MAX))
    assert info.value.reason == reason
    assert guard.hwm(RESOURCE) == 5
    assert _written(store, conn) == [5]
    _write(store, guard, 5)  # the real holder still writes
    assert _written(store, conn) == [5, 5]


def test_proof_for_another_resource_is_refused(store, conn, guard):
    with pytest.raises(InvalidProof) as info:
        _write(store, guard, 7, proof=SIGNER.sign("orders/8", 7))
    assert info.value.reason == "wrong_resource"
    assert guard.hwm(RESOURCE) is None and guard.hwm("orders/8") is None
    assert _written(store, conn) == []


def test_text_form_proof_is_accepted(store, conn, guard):
    _write(store, guard, 4, proof=to_text(SIGNER.sign(RESOURCE, 4)))
    assert guard.hwm(RESOURCE) == 4


def test_guard_with_verifier_refuses_a_bare_int(store, conn, guard):
    with pytest.raises(TypeError, match="proof"):
        _write(store, guard, 7, proof=7)
    assert guard.hwm(RESOURCE) is None


# -- transactions ---------------------------------------------------------------------------


class _Boom(Exception):
    pass


@pytest.mark.parametrize("failure", ["exception", "sql-error", "keyboard-interrupt"])
def test_failure_in_the_body_rolls_back_mutation_and_hwm(store, conn, guard, failure):
    _write(store, guard, 5)
    expected = {"exception": _Boom, "sql-error": store.integrity_error, "keyboard-interrupt": KeyboardInterrupt}
    with pytest.raises(expected[failure]):
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 6)) as cur:
            cur.execute(f"INSERT INTO writes (resource, token) VALUES ({store.param}, '6')", (RESOURCE,))
            assert guard.hwm(RESOURCE) == 6  # raised inside the transaction...
            if failure == "exception":
                raise _Boom()
            if failure == "sql-error":
                cur.execute("INSERT INTO writes (resource, token) VALUES (NULL, NULL)")
            raise KeyboardInterrupt
    assert guard.hwm(RESOURCE) == 5  # ...and rolled back with the mutation
    assert _written(store, conn) == [5]
    assert not store.in_transaction(conn)
    _write(store, guard, 5)  # so the holder of 5 is not fenced off by a write that never happened
    assert _written(store, conn) == [5, 5]


def test_refuses_a_connection_already_in_a_transaction(store, conn, guard):
    store.begin(conn)
    conn.execute("INSERT INTO writes (resource, token) VALUES ('caller', '1')")
    with pytest.raises(RuntimeError, match="already in a transaction"):
        _write(store, guard, 5)
    assert store.in_transaction(conn)  # the caller's transaction is left alone
    store.rollback(conn)
    assert guard.hwm(RESOURCE) is None
    assert _written(store, conn, "caller") == []


def test_refuses_a_body_that_ends_the_transaction_itself(store, conn, guard):
    with pytest.raises(RuntimeError, match="ended the guard's transaction"):
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)):
            conn.execute("COMMIT")
    assert not store.in_transaction(conn)


def test_sqlite_leaves_connection_settings_alone(tmp_path):
    store = SqliteStore(str(tmp_path / "store.db"))
    conn = store.connect()
    conn.execute("PRAGMA synchronous=NORMAL")
    guard = guard_stores.setup(store, conn, VERIFIER)
    _write(store, guard, 1)
    assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL, as the caller set it
    assert conn.isolation_level == ""
    conn.close()


def test_hwm_survives_closing_and_reopening(store):
    conn = store.connect()
    _write(store, guard_stores.setup(store, conn, VERIFIER), 7)
    conn.close()
    conn = store.connect()
    guard = guard_stores.setup(store, conn, VERIFIER)  # ensure_schema on an existing table keeps it
    assert guard.hwm(RESOURCE) == 7
    with pytest.raises(StaleToken):
        _write(store, guard, 6)
    assert _written(store, conn) == [7]
    conn.close()


# -- two processes --------------------------------------------------------------------------

_RACE_ROUNDS = 20
_RACE_NEW_WRITES = 5


def _race_writer(store, public_pem, token, proofs, barrier, first_five, results):
    """Token 5 writes until refused; token 6 waits until a 5 has landed, then writes a few times."""
    try:
        conn = store.connect()
        guard = guard_stores.setup(store, conn, ProofVerifier([serialization.load_pem_public_key(public_pem)]))
        landed = []
        for round_, proof in enumerate(proofs):
            resource = f"race/{round_}"
            barrier.wait(timeout=60)
            count = 0
            if token == 5:
                while not barrier.broken:  # broken: the other writer failed and will never write 6
                    try:
                        _write(store, guard, 5, resource, proof)
                    except StaleToken as exc:
                        assert exc.hwm == 6, exc
                        break
                    count += 1
                    first_five[round_].set()
            else:
                # Start once a 5 has landed, so that the two interleave in every round.
                assert first_five[round_].wait(timeout=60), "no token-5 write landed"
                for _ in range(_RACE_NEW_WRITES):
                    _write(store, guard, 6, resource, proof)
                    count += 1
            landed.append(count)
        conn.close()
        results.put((token, landed))
    except BaseException:  # noqa: BLE001 - the writer process's every failure, assertions too, goes back to the test
        results.put((token, traceback.format_exc()))
        barrier.abort()  # so the other writer stops waiting for this one
        for event in first_five:
            event.set()


@pytest.mark.parametrize("kind, journal_mode", [("sqlite-default", "delete"), ("sqlite-default", "wal"),
                                               ("postgres", None)])
def test_two_processes_racing_never_land_an_old_token_after_a_new_one(request, tmp_path, kind, journal_mode):
    store = _store(kind, tmp_path, request)
    conn = store.connect()
    if journal_mode is not None:
        assert conn.execute(f"PRAGMA journal_mode={journal_mode}").fetchone() == (journal_mode,)
    guard_stores.setup(store, conn, VERIFIER)
    public_pem = KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    first_five = [ctx.Event() for _ in range(_RACE_ROUNDS)]
    procs = [
        ctx.Process(
            target=_race_writer,
            args=(
                store, public_pem, token, [SIGNER.sign(f"race/{i}", token) for i in range(_RACE_ROUNDS)],
                barrier, first_five, results,
            ),
        )
        for token in (5, 6)
    ]
    for p in procs:
        p.start()
    try:
        landed = dict(results.get(timeout=120) for _ in procs)
    except queue.Empty:
        pytest.fail("a race writer did not report within 120 s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    failed = {token: report for token, report in landed.items() if not isinstance(report, list)}
    assert not failed, "\n".join(f"writer {token} failed:\n{report}" for token, report in failed.items())
    for round_ in range(_RACE_ROUNDS):
        tokens = _written(store, conn, f"race/{round_}")
        assert tokens == sorted(tokens), f"round {round_}: a 5 landed after a 6: {tokens}"
        # Every write a writer saw accepted is there, and nothing it saw refused.
        assert tokens.count(5) == landed[5][round_] >= 1
        assert tokens.count(6) == landed[6][round_] == _RACE_NEW_WRITES
        assert store.guard(conn, VERIFIER).hwm(f"race/{round_}") == 6
    assert [p.exitcode for p in procs] == [0, 0]
    conn.close()


# -- trusted mode and argument errors -------------------------------------------------------


def test_without_verifier_ints_are_tokens(store, conn):
    guard = guard_stores.setup(store, conn, None)
    _write(store, guard, 3, proof=3)
    _write(store, guard, TOKEN_MAX, proof=TOKEN_MAX)
    with pytest.raises(StaleToken):
        _write(store, guard, 3, proof=3)
    assert _written(store, conn) == [3, TOKEN_MAX]


@pytest.mark.parametrize(
    "token, error",
    [(True, TypeError), (False, TypeError), (0, ValueError), (-1, ValueError), (TOKEN_MAX + 1, ValueError),
     ("7", TypeError), (7.0, TypeError), (None, TypeError), (SIGNER.sign(RESOURCE, 7), TypeError)],
    ids=["true", "false", "zero", "negative", "2**64", "str", "float", "none", "proof"],
)
def test_without_verifier_non_tokens_are_refused(store, conn, token, error):
    guard = guard_stores.setup(store, conn, None)
    with pytest.raises(error, match="token"):
        _write(store, guard, 7, proof=token)
    assert guard.hwm(RESOURCE) is None
    assert not store.in_transaction(conn)


@pytest.mark.parametrize(
    "table",
    ["", "1abc", "a-b", "a;DROP TABLE writes", 'a"b', "fencing hwm", "x" * 64, "é", None],
)
def test_bad_table_name_is_refused(store, conn, table):
    with pytest.raises(ValueError, match="table name"):
        store.guard(conn, VERIFIER, table=table)
    assert store.tables(conn) == set()


def test_sqlite_reserves_its_own_table_names(tmp_path):
    conn = sqlite3.connect(tmp_path / "store.db")
    with pytest.raises(ValueError, match="'sqlite_' are reserved by the database"):
        SqliteGuard(conn, VERIFIER, table="sqlite_hwm")
    conn.close()


def test_custom_table_name_even_a_keyword(store, conn):
    guard = guard_stores.setup(store, conn, VERIFIER, table="order")
    _write(store, guard, 2)
    assert guard.hwm(RESOURCE) == 2
    assert store.query(conn, 'SELECT resource FROM "order"') == [(RESOURCE,)]
    assert store.tables(conn) == {"order", "writes"}  # and no fencing_hwm


def test_argument_types_are_checked(store, conn, guard):
    with pytest.raises(TypeError, match=r"connection must be a \w+\.Connection"):
        type(guard)(str(conn), VERIFIER)
    with pytest.raises(TypeError, match="ProofVerifier"):
        type(guard)(conn, KEY.public_key())
    with pytest.raises(TypeError, match="resource"):
        guard.hwm(b"orders/7")
    with pytest.raises(ValueError, match="resource"):
        _write(store, guard, 1, resource="")
    with pytest.raises(TypeError, match="resource"):
        with guard.fenced(7, SIGNER.sign(RESOURCE, 1)):
            pass
    assert not store.in_transaction(conn)
