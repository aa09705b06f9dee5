"""PostgresGuard against a real PostgreSQL server that these tests start (testsupport.postgres).

The rule itself is shared with the SQLite guard (guard_rule.Guard, tested in test_guard.py);
here: the PostgreSQL storage (uint64 in numeric, both autocommit modes, rollback of a failed
statement, the caller's settings), and isolation under READ COMMITTED: two holders in two
processes racing across a pause, where the old holder's statement must never commit after
the new holder's, and two first writers racing to create a resource's mark.
"""

import multiprocessing
import queue
import threading
import traceback

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.client import exceptions
from coordinator.client.proof import TOKEN_MAX, InvalidProof, ProofSigner, ProofVerifier
from testsupport.postgres import PostgresMissing, PostgresServer
from testsupport.supervisor import wait_until

try:
    import psycopg
    from psycopg.rows import dict_row

    from coordinator.client.pg_guard import PostgresGuard, StaleToken
except ImportError as exc:  # fail every test with the fix, never skip (tests/conftest.py)
    psycopg = None
    _IMPORT_ERROR = f"{exc}: install the test extra, pip install -e '.[test]' (it includes psycopg)"

KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])
RESOURCE = "orders/7"
# How long a racing holder waits for its cue: far above the sub-second the steps take, so a
# loaded machine does not fail the test, and still an end if a process died.
CUE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def server():
    if psycopg is None:
        pytest.fail(_IMPORT_ERROR)
    try:
        pg = PostgresServer()
    except PostgresMissing as exc:
        pytest.fail(str(exc))
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def dsn(server):
    return server.new_database()


def _setup(conn, verifier=VERIFIER, **kwargs):
    """The guard's table plus the caller's own data: one row per accepted write, in commit order."""
    guard = PostgresGuard(conn, verifier, **kwargs)
    guard.ensure_schema()
    with conn.transaction():
        conn.execute(
            "CREATE TABLE IF NOT EXISTS writes (seq bigserial PRIMARY KEY, resource text NOT NULL,"
            " token numeric(20,0) NOT NULL)"
        )
    return guard


def _write(guard, token, resource=RESOURCE, proof=None):
    with guard.fenced(resource, SIGNER.sign(resource, token) if proof is None else proof) as cur:
        cur.execute("INSERT INTO writes (resource, token) VALUES (%s, %s)", (resource, token))


def _written(conn, resource=RESOURCE):
    with conn.transaction():
        rows = conn.execute("SELECT token FROM writes WHERE resource = %s ORDER BY seq", (resource,)).fetchall()
    return [int(t) for (t,) in rows]


def _idle(conn):
    return conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.fixture(params=[False, True], ids=["transaction-mode", "autocommit-mode"])
def conn(request, dsn):
    with psycopg.connect(dsn, autocommit=request.param) as c:
        yield c


@pytest.fixture
def guard(conn):
    return _setup(conn)


# -- the rule, stored in PostgreSQL ---------------------------------------------------------


def test_first_equal_higher_then_stale_is_refused_before_the_body(conn, guard):
    assert guard.hwm(RESOURCE) is None
    _write(guard, 5)
    _write(guard, 5)
    _write(guard, 6)
    assert guard.hwm(RESOURCE) == 6
    body_ran = False
    with pytest.raises(StaleToken) as info:
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)) as cur:
            body_ran = True
            cur.execute("INSERT INTO writes (resource, token) VALUES (%s, 5)", (RESOURCE,))
    assert not body_ran
    assert type(info.value) is exceptions.StaleToken  # the client's class: one except for every fence
    assert (info.value.resource, info.value.token, info.value.hwm) == (RESOURCE, 5, 6)
    assert _written(conn) == [5, 5, 6]
    assert _idle(conn)  # committed / rolled back: the connection is free


def test_tokens_above_2_63_up_to_uint64_max(conn, guard):
    _write(guard, 2**63 - 1)
    _write(guard, 2**63)  # above bigint
    with pytest.raises(StaleToken):
        _write(guard, 2**63 - 1)
    _write(guard, TOKEN_MAX)
    assert guard.hwm(RESOURCE) == TOKEN_MAX
    with pytest.raises(StaleToken) as info:
        _write(guard, 2**63)
    assert info.value.hwm == TOKEN_MAX
    assert _written(conn) == [2**63 - 1, 2**63, TOKEN_MAX]


def test_forged_huge_token_changes_nothing(conn, guard):
    _write(guard, 5)
    forged = ProofSigner(Ed25519PrivateKey.generate()).sign(RESOURCE, TOKEN_MAX)
    with pytest.raises(InvalidProof) as info:
        _write(guard, TOKEN_MAX, proof=forged)
    assert info.value.reason == "unknown_key"
    assert guard.hwm(RESOURCE) == 5
    _write(guard, 5)  # the real holder still writes
    assert _written(conn) == [5, 5]


def test_hwm_is_durable_across_connections(dsn):
    with psycopg.connect(dsn) as first:
        _write(_setup(first), 7)
    with psycopg.connect(dsn) as second:
        guard = _setup(second)  # ensure_schema on an existing table keeps it
        assert guard.hwm(RESOURCE) == 7
        with pytest.raises(StaleToken):
            _write(guard, 6)
        assert _written(second) == [7]


# -- transactions ---------------------------------------------------------------------------


class _Boom(Exception):
    pass


@pytest.mark.parametrize("failure", ["exception", "sql-error"])
def test_failure_in_the_body_rolls_back_mutation_and_hwm(conn, guard, failure):
    _write(guard, 5)
    expected = {"exception": _Boom, "sql-error": psycopg.errors.NotNullViolation}[failure]
    with pytest.raises(expected):
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 6)) as cur:
            cur.execute("INSERT INTO writes (resource, token) VALUES (%s, 6)", (RESOURCE,))
            if failure == "exception":
                raise _Boom()
            cur.execute("INSERT INTO writes (resource, token) VALUES (NULL, NULL)")  # the transaction fails
    assert _idle(conn)
    assert guard.hwm(RESOURCE) == 5  # raised inside the transaction, rolled back with the mutation
    assert _written(conn) == [5]
    _write(guard, 5)  # so the holder of 5 is not fenced off by a write that never happened
    assert _written(conn) == [5, 5]


def test_refuses_a_connection_already_in_a_transaction(dsn):
    with psycopg.connect(dsn) as conn:
        guard = _setup(conn)
        conn.execute("INSERT INTO writes (resource, token) VALUES ('caller', 1)")  # opens one
        with pytest.raises(RuntimeError, match="already in a transaction"):
            _write(guard, 5)
        assert not _idle(conn)  # the caller's transaction is left alone
        conn.rollback()
        assert guard.hwm(RESOURCE) is None
        assert _written(conn, "caller") == []


def test_refuses_a_body_that_ends_the_transaction_itself(conn, guard):
    with pytest.raises(RuntimeError, match="ended the guard's transaction"):
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 5)):
            conn.commit()
    assert _idle(conn)


def test_leaves_connection_settings_alone(dsn):
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        guard = _setup(conn)
        _write(guard, 1)
        assert guard.hwm(RESOURCE) == 1  # read with its own row factory, not the caller's dict rows
        assert (conn.autocommit, conn.isolation_level) == (False, psycopg.IsolationLevel.READ_COMMITTED)
        assert conn.row_factory is dict_row
        with guard.fenced(RESOURCE, SIGNER.sign(RESOURCE, 1)) as cur:
            cur.execute("SELECT count(*) AS n FROM writes")
            assert cur.fetchone() == {"n": 1}  # the body's cursor is the caller's kind


# -- races ----------------------------------------------------------------------------------


def _child_verifier(public_pem):
    # A spawned child imports this module afresh, with a KEY of its own: it gets the parent's.
    return ProofVerifier([serialization.load_pem_public_key(public_pem)])


def _paused_holder(conninfo, public_pem, proof, checked, go, results):
    """Token 5: passes the guard's check, then pauses before its statement until ``go``."""
    try:
        with psycopg.connect(conninfo) as conn:
            guard = PostgresGuard(conn, _child_verifier(public_pem))
            with guard.fenced(RESOURCE, proof) as cur:
                checked.set()
                assert go.wait(CUE_TIMEOUT_S), "never told to go on"
                cur.execute("INSERT INTO writes (resource, token) VALUES (%s, 5)", (RESOURCE,))
        results.put((5, "committed"))
    except BaseException:
        results.put((5, traceback.format_exc()))


def _new_holder(conninfo, public_pem, proof, done, results):
    """Token 6: writes once; ``done`` once its transaction has ended either way."""
    try:
        with psycopg.connect(conninfo) as conn:
            _write(PostgresGuard(conn, _child_verifier(public_pem)), 6, proof=proof)
        results.put((6, "committed"))
    except BaseException:
        results.put((6, traceback.format_exc()))
    finally:
        done.set()


def _backend_waits_for_a_lock(admin, application_name):
    with admin.transaction():
        row = admin.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


def test_an_old_holder_paused_between_check_and_statement_never_commits_after_the_new_one(server, dsn):
    """Holder 5 passes the check, then pauses (GC, a stalled VM) before its statement; holder 6
    arrives meanwhile. Under READ COMMITTED a plain read of the mark would let 6 commit and then
    5 commit after it. The guard's row lock makes 6 wait for 5's transaction instead: 5's write
    is ordered before 6's, and 6 then reads the mark 5 left."""
    with psycopg.connect(dsn) as conn:
        # Holder 5 has written before in its epoch: the mark exists, so no insert conflict
        # can order the two holders, only the guard's lock on the mark.
        _write(_setup(conn), 5)
    pem = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    ctx = multiprocessing.get_context("spawn")
    checked, go, done, results = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    old = ctx.Process(target=_paused_holder,
                      args=(dsn + " application_name=holder5", pem, SIGNER.sign(RESOURCE, 5), checked, go, results))
    new = ctx.Process(target=_new_holder,
                      args=(dsn + " application_name=holder6", pem, SIGNER.sign(RESOURCE, 6), done, results))
    old.start()
    try:
        assert checked.wait(CUE_TIMEOUT_S), "holder 5 never passed the guard's check"
        new.start()
        with psycopg.connect(dsn, autocommit=True) as admin:
            # Until holder 6 either waits on holder 5's lock (the fix) or has finished (no lock).
            wait_until(lambda: done.is_set() or _backend_waits_for_a_lock(admin, "holder6"), CUE_TIMEOUT_S,
                       what="holder 6 to wait on a lock or finish")
        new_finished_during_the_pause = done.is_set()
        go.set()
        try:
            reports = dict(results.get(timeout=CUE_TIMEOUT_S) for _ in range(2))
        except queue.Empty:
            pytest.fail(f"a holder did not report within {CUE_TIMEOUT_S} s")
    finally:
        go.set()
        for p in (old, new):
            if p.pid is not None:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    with psycopg.connect(dsn) as conn:
        tokens = _written(conn)
        hwm = PostgresGuard(conn, VERIFIER).hwm(RESOURCE)
    assert tokens == sorted(tokens), f"the old holder's write committed after the new one's: {tokens}"
    assert not new_finished_during_the_pause, "holder 6 committed while holder 5 sat between check and write"
    assert reports == {5: "committed", 6: "committed"}, reports
    assert (tokens, hwm) == ([5, 5, 6], 6)


def _second_writer_behind_the_first(dsn, token_a, token_b, prepare_b=lambda conn: None):
    """Holder A writes ``token_a`` and, before it commits, holder B (another connection, in a
    thread) tries ``token_b`` and must wait on A's lock. Returns B's outcome: "committed" or
    the exception it raised, once A has committed."""
    with (psycopg.connect(dsn) as a, psycopg.connect(dsn + " application_name=second_writer") as b,
          psycopg.connect(dsn, autocommit=True) as admin):
        guard_a, guard_b = _setup(a), PostgresGuard(b, VERIFIER)
        prepare_b(b)
        outcome = {}

        def second():
            try:
                _write(guard_b, token_b)
                outcome["b"] = "committed"
            except BaseException as exc:  # reported to the test thread below
                outcome["b"] = exc

        with guard_a.fenced(RESOURCE, SIGNER.sign(RESOURCE, token_a)) as cur:
            cur.execute("INSERT INTO writes (resource, token) VALUES (%s, %s)", (RESOURCE, token_a))
            racer = threading.Thread(target=second)
            racer.start()
            wait_until(lambda: _backend_waits_for_a_lock(admin, "second_writer"), CUE_TIMEOUT_S,
                       what="the second writer to wait on the first one's lock")
        racer.join(CUE_TIMEOUT_S)
        assert not racer.is_alive()
        return outcome["b"]


def test_two_first_writers_of_a_resource_race_to_create_its_mark(dsn):
    """Both find no mark; the second's insert waits for the first, which commits token 6: the
    second must then be judged against 6 (StaleToken), not fail on the duplicate key."""
    refused = _second_writer_behind_the_first(dsn, 6, 5)
    assert isinstance(refused, StaleToken) and refused.hwm == 6, refused
    with psycopg.connect(dsn) as conn:
        assert _written(conn) == [6]


def test_under_repeatable_read_a_waiting_guard_fails_to_serialize_and_writes_nothing(dsn):
    """The docstring's promise for stricter isolation: the guard behind a raised mark gets
    SerializationFailure, its write is not applied, and a retry is judged against the new mark."""
    with psycopg.connect(dsn) as conn:
        _write(_setup(conn), 5)

    def repeatable_read(conn):
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

    failed = _second_writer_behind_the_first(dsn, 6, 7, prepare_b=repeatable_read)
    assert isinstance(failed, psycopg.errors.SerializationFailure), failed
    with psycopg.connect(dsn) as conn:
        guard = PostgresGuard(conn, VERIFIER)
        assert (_written(conn), guard.hwm(RESOURCE)) == ([5, 6], 6)
        _write(guard, 7)  # the retry
        assert (_written(conn), guard.hwm(RESOURCE)) == ([5, 6, 7], 7)


# -- argument errors --------------------------------------------------------------------------


@pytest.mark.parametrize("table", ["", "1abc", 'a"b', "a;DROP TABLE writes", "x" * 64, None])
def test_bad_table_name_is_refused(conn, table):
    with pytest.raises(ValueError, match="table name"):
        PostgresGuard(conn, VERIFIER, table=table)


def test_custom_table_name_even_a_keyword(conn):
    guard = _setup(conn, table="order")
    _write(guard, 2)
    assert guard.hwm(RESOURCE) == 2
    with conn.transaction():
        assert conn.execute('SELECT resource, hwm FROM "order"').fetchall() == [(RESOURCE, 2)]


def test_argument_types_are_checked(conn, guard):
    with pytest.raises(TypeError, match="psycopg.Connection"):
        PostgresGuard(object(), VERIFIER)
    with pytest.raises(TypeError, match="ProofVerifier"):
        PostgresGuard(conn, KEY.public_key())
    with pytest.raises(ValueError, match="resource"):
        _write(guard, 1, resource="")
    assert _idle(conn)


def test_a_machine_without_postgresql_fails_with_how_to_install_it(monkeypatch, tmp_path):
    """Never a skip: without the server binaries the fixture fails with this line."""
    import testsupport.postgres as harness

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(harness, "DEBIAN_BINDIRS", str(tmp_path / "*" / "bin"))
    with pytest.raises(PostgresMissing, match=r"apt-get install -y postgresql"):
        PostgresServer()
