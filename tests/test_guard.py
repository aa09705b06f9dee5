"""SqliteGuard on real SQLite files: the fencing rule, proof checks, rollback, durability, races."""

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
from coordinator.core.names import ErrorReason
from coordinator.client.proof import TOKEN_MAX, InvalidProof, ProofSigner, ProofVerifier, to_text

KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])
RESOURCE = "orders/7"


def _connect(path, isolation_level=""):
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=isolation_level)
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _setup(conn, verifier=VERIFIER, **kwargs):
    """The guard's table plus the caller's own data: one row per accepted write, in commit order."""
    guard = SqliteGuard(conn, verifier, **kwargs)
    guard.ensure_schema()
    conn.execute(
        "CREATE TABLE IF NOT EXISTS writes (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
        " resource TEXT NOT NULL, token TEXT NOT NULL)"
    )
    if conn.in_transaction:
        conn.commit()
    return guard


def _write(guard, token, resource=RESOURCE, proof=None):
    """One fenced write of ``token``, signed for ``resource`` unless ``proof`` is given."""
    if proof is None:
        proof = SIGNER.sign(resource, token)
    with guard.fenced(resource, proof) as cur:
        cur.execute("INSERT INTO writes (resource, token) VALUES (?, ?)", (resource, str(token)))


def _written(conn, resource=RESOURCE):
    rows = conn.execute("SELECT token FROM writes WHERE resource = ? ORDER BY seq", (resource,)).fetchall()
    return [int(t) for (t,) in rows]


@pytest.fixture(params=["", None], ids=["default-mode", "autocommit-mode"])
def conn(request, tmp_path):
    """A connection in the sqlite3 module's default mode, or with isolation_level=None."""
    c = _connect(tmp_path / "store.db", isolation_level=request.param)
    yield c
    c.close()


@pytest.fixture
def guard(conn):
    return _setup(conn)


# -- the rule -------------------------------------------------------------------------------


def test_first_write_creates_the_hwm(conn, guard):
    assert guard.hwm(RESOURCE) is None
    _write(guard, 5)
    assert guard.hwm(RESOURCE) == 5
    assert _written(conn) == [5]
    assert not conn.in_transaction  # committed


def test_equal_token_writes_many_times(conn, guard):
    _write(guard, 5)
    _write(guard, 5)
    _write(guard, 5)
    assert guard.hwm(RESOURCE) == 5
    assert _written(conn) == [5, 5, 5]


def test_higher_token_raises_hwm_then_old_token_is_stale_and_not_applied(conn, guard):
    _write(guard, 5)
    _write(guard, 6)
    assert guard.hwm(RESOURCE) == 6
    body_ran = False
    with pytest.raises(StaleToken) as info:
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)) as cur:
            body_ran = True
            cur.execute("INSERT INTO writes (resource, token) VALUES (?, '5')", (RESOURCE,))
    assert not body_ran
    assert (info.value.resource, info.value.token, info.value.hwm) == (RESOURCE, 5, 6)
    assert "stale" in str(info.value) and "5" in str(info.value) and "6" in str(info.value)
    assert _written(conn) == [5, 6]
    assert guard.hwm(RESOURCE) == 6
    assert not conn.in_transaction  # rolled back, the connection is free


def test_the_guards_stale_token_is_the_clients_so_one_except_catches_both(guard):
    # A service that writes through the coordinator and through a guard handles a fenced
    # holder in one place: the guard raises the very class the client raises.
    _write(guard, 6)
    with pytest.raises(exceptions.StaleToken) as info:
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)):
            pass
    refusal = info.value
    assert type(refusal) is exceptions.StaleToken and isinstance(refusal, exceptions.Refused)
    assert (refusal.code, refusal.reason, refusal.metadata) == (None, ErrorReason.STALE_TOKEN, {"hwm": "6"})
    assert refusal.category == "refused"


def test_an_invalid_proof_is_in_the_clients_exception_tree_too(guard):
    # One tree for the client and the guards: ``except FencingError`` catches a guard's refusal
    # of a forged proof as well; ValueError still catches it, as it did before.
    forged = ProofSigner(Ed25519PrivateKey.generate()).sign(RESOURCE, 5)
    with pytest.raises(exceptions.FencingError) as info:
        _write(guard, 5, proof=forged)
    refusal = info.value
    assert type(refusal) is InvalidProof is exceptions.InvalidProof
    assert isinstance(refusal, exceptions.Refused) and isinstance(refusal, ValueError)
    assert (refusal.reason, refusal.category, refusal.code) == ("unknown_key", "refused", None)
    assert "does not trust" in str(refusal)
    assert guard.hwm(RESOURCE) is None


def test_resources_are_fenced_independently(conn, guard):
    _write(guard, 9, resource="a")
    _write(guard, 2, resource="b")
    assert (guard.hwm("a"), guard.hwm("b")) == (9, 2)
    with pytest.raises(StaleToken):
        _write(guard, 1, resource="b")


def test_padding_keeps_number_order(conn, guard):
    """9 then 10: as unpadded text "10" < "9"; the guard must still see 10 as higher."""
    _write(guard, 9)
    _write(guard, 10)
    assert guard.hwm(RESOURCE) == 10
    with pytest.raises(StaleToken):
        _write(guard, 9)
    assert conn.execute("SELECT hwm FROM fencing_hwm").fetchall() == [("00000000000000000010",)]


def test_uint64_max_token_and_tokens_above_2_63(conn, guard):
    _write(guard, 2**63 - 1)
    _write(guard, 2**63)  # above SQLite's signed INTEGER range
    assert guard.hwm(RESOURCE) == 2**63
    with pytest.raises(StaleToken):
        _write(guard, 2**63 - 1)
    _write(guard, TOKEN_MAX)
    assert guard.hwm(RESOURCE) == TOKEN_MAX
    with pytest.raises(StaleToken) as info:
        _write(guard, 2**63)
    assert info.value.hwm == TOKEN_MAX
    assert conn.execute("SELECT hwm FROM fencing_hwm").fetchone() == (str(TOKEN_MAX),)
    assert _written(conn) == [2**63 - 1, 2**63, TOKEN_MAX]


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
def test_never_issued_token_is_refused_and_changes_nothing(conn, guard, forge, reason):
    """A huge made-up token would lock real holders out; without a valid proof it changes nothing."""
    _write(guard, 5)
    with pytest.raises(InvalidProof) as info:
        _write(guard, TOKEN_MAX, proof=forge(TOKEN_MAX))
    assert info.value.reason == reason
    assert guard.hwm(RESOURCE) == 5
    assert _written(conn) == [5]
    _write(guard, 5)  # the real holder still writes
    assert _written(conn) == [5, 5]


def test_proof_for_another_resource_is_refused(conn, guard):
    with pytest.raises(InvalidProof) as info:
        _write(guard, 7, proof=SIGNER.sign("orders/8", 7))
    assert info.value.reason == "wrong_resource"
    assert guard.hwm(RESOURCE) is None and guard.hwm("orders/8") is None
    assert _written(conn) == []


def test_text_form_proof_is_accepted(conn, guard):
    _write(guard, 4, proof=to_text(SIGNER.sign(RESOURCE, 4)))
    assert guard.hwm(RESOURCE) == 4


def test_guard_with_verifier_refuses_a_bare_int(conn, guard):
    with pytest.raises(TypeError, match="proof"):
        _write(guard, 7, proof=7)
    assert guard.hwm(RESOURCE) is None


# -- transactions ---------------------------------------------------------------------------


class _Boom(Exception):
    pass


@pytest.mark.parametrize("failure", ["exception", "sql-error", "keyboard-interrupt"])
def test_failure_in_the_body_rolls_back_mutation_and_hwm(conn, guard, failure):
    _write(guard, 5)
    expected = {"exception": _Boom, "sql-error": sqlite3.IntegrityError, "keyboard-interrupt": KeyboardInterrupt}
    with pytest.raises(expected[failure]):
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 6)) as cur:
            cur.execute("INSERT INTO writes (resource, token) VALUES (?, '6')", (RESOURCE,))
            assert guard.hwm(RESOURCE) == 6  # raised inside the transaction...
            if failure == "exception":
                raise _Boom()
            if failure == "sql-error":
                cur.execute("INSERT INTO writes (resource, token) VALUES (NULL, NULL)")
            raise KeyboardInterrupt
    assert guard.hwm(RESOURCE) == 5  # ...and rolled back with the mutation
    assert _written(conn) == [5]
    assert not conn.in_transaction
    _write(guard, 5)  # so the holder of 5 is not fenced off by a write that never happened
    assert _written(conn) == [5, 5]


def test_refuses_a_connection_already_in_a_transaction(conn, guard):
    conn.execute("BEGIN")
    conn.execute("INSERT INTO writes (resource, token) VALUES ('caller', '1')")
    with pytest.raises(RuntimeError, match="already in a transaction"):
        _write(guard, 5)
    assert conn.in_transaction  # the caller's transaction is left alone
    conn.execute("ROLLBACK")
    assert guard.hwm(RESOURCE) is None
    assert _written(conn, "caller") == []


def test_refuses_a_body_that_ends_the_transaction_itself(conn, guard):
    with pytest.raises(RuntimeError, match="ended the guard's transaction"):
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)):
            conn.execute("COMMIT")
    assert not conn.in_transaction


def test_leaves_connection_settings_alone(tmp_path):
    conn = _connect(tmp_path / "store.db")
    conn.execute("PRAGMA synchronous=NORMAL")
    guard = _setup(conn)
    _write(guard, 1)
    assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL, as the caller set it
    assert conn.isolation_level == ""
    conn.close()


def test_hwm_survives_closing_and_reopening(tmp_path):
    path = tmp_path / "store.db"
    conn = _connect(path)
    _write(_setup(conn), 7)
    conn.close()
    conn = _connect(path)
    guard = _setup(conn)  # ensure_schema on an existing table keeps it
    assert guard.hwm(RESOURCE) == 7
    with pytest.raises(StaleToken):
        _write(guard, 6)
    assert _written(conn) == [7]
    conn.close()


# -- two processes --------------------------------------------------------------------------

_RACE_ROUNDS = 20
_RACE_NEW_WRITES = 5


def _race_writer(db_path, public_pem, token, proofs, barrier, first_five, results):
    """Token 5 writes until refused; token 6 waits until a 5 has landed, then writes a few times."""
    try:
        conn = _connect(db_path)
        guard = _setup(conn, ProofVerifier([serialization.load_pem_public_key(public_pem)]))
        landed = []
        for round_, proof in enumerate(proofs):
            resource = f"race/{round_}"
            barrier.wait(timeout=60)
            count = 0
            if token == 5:
                while not barrier.broken:  # broken: the other writer failed and will never write 6
                    try:
                        _write(guard, 5, resource, proof)
                    except StaleToken as exc:
                        assert exc.hwm == 6, exc
                        break
                    count += 1
                    first_five[round_].set()
            else:
                # Start once a 5 has landed, so that the two interleave in every round.
                assert first_five[round_].wait(timeout=60), "no token-5 write landed"
                for _ in range(_RACE_NEW_WRITES):
                    _write(guard, 6, resource, proof)
                    count += 1
            landed.append(count)
        conn.close()
        results.put((token, landed))
    except BaseException:
        results.put((token, traceback.format_exc()))
        barrier.abort()  # so the other writer stops waiting for this one
        for event in first_five:
            event.set()


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_two_processes_racing_never_land_an_old_token_after_a_new_one(tmp_path, journal_mode):
    path = tmp_path / "store.db"
    conn = _connect(path)
    assert conn.execute(f"PRAGMA journal_mode={journal_mode}").fetchone() == (journal_mode,)
    _setup(conn)
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
                str(path), public_pem, token, [SIGNER.sign(f"race/{i}", token) for i in range(_RACE_ROUNDS)],
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
        tokens = _written(conn, f"race/{round_}")
        assert tokens == sorted(tokens), f"round {round_}: a 5 landed after a 6: {tokens}"
        # Every write a writer saw accepted is there, and nothing it saw refused.
        assert tokens.count(5) == landed[5][round_] >= 1
        assert tokens.count(6) == landed[6][round_] == _RACE_NEW_WRITES
        assert SqliteGuard(conn, VERIFIER).hwm(f"race/{round_}") == 6
    assert [p.exitcode for p in procs] == [0, 0]
    conn.close()


# -- trusted mode and argument errors -------------------------------------------------------


def test_without_verifier_ints_are_tokens(conn):
    guard = _setup(conn, verifier=None)
    _write(guard, 3, proof=3)
    _write(guard, TOKEN_MAX, proof=TOKEN_MAX)
    with pytest.raises(StaleToken):
        _write(guard, 3, proof=3)
    assert _written(conn) == [3, TOKEN_MAX]


@pytest.mark.parametrize(
    "token, error",
    [(True, TypeError), (False, TypeError), (0, ValueError), (-1, ValueError), (TOKEN_MAX + 1, ValueError),
     ("7", TypeError), (7.0, TypeError), (None, TypeError), (SIGNER.sign(RESOURCE, 7), TypeError)],
    ids=["true", "false", "zero", "negative", "2**64", "str", "float", "none", "proof"],
)
def test_without_verifier_non_tokens_are_refused(conn, token, error):
    guard = _setup(conn, verifier=None)
    with pytest.raises(error, match="token"):
        _write(guard, 7, proof=token)
    assert guard.hwm(RESOURCE) is None
    assert not conn.in_transaction


@pytest.mark.parametrize(
    "table",
    ["", "1abc", "a-b", "a;DROP TABLE writes", 'a"b', "fencing hwm", "sqlite_hwm", "x" * 64, "é", None],
)
def test_bad_table_name_is_refused(conn, table):
    with pytest.raises(ValueError, match="table name"):
        SqliteGuard(conn, VERIFIER, table=table)


def test_custom_table_name_even_a_keyword(conn):
    guard = _setup(conn, table="order")
    _write(guard, 2)
    assert guard.hwm(RESOURCE) == 2
    assert conn.execute('SELECT hwm FROM "order"').fetchone() == ("00000000000000000002",)
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'fencing_hwm'").fetchall() == []


def test_argument_types_are_checked(conn, guard):
    with pytest.raises(TypeError, match="sqlite3.Connection"):
        SqliteGuard(str(conn), VERIFIER)
    with pytest.raises(TypeError, match="ProofVerifier"):
        SqliteGuard(conn, KEY.public_key())
    with pytest.raises(TypeError, match="resource"):
        guard.hwm(b"orders/7")
    with pytest.raises(ValueError, match="resource"):
        _write(guard, 1, resource="")
    with pytest.raises(TypeError, match="resource"):
        with guard.fenced(7, SIGNER.sign(RESOURCE, 1)):
            pass
    assert not conn.in_transaction
