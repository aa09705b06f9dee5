"""PostgresGuard's own concerns on a real PostgreSQL server that the tests start (the
postgres_server fixture, testsupport.postgres).

The contract every guard keeps (the rule, proofs, rollback, durability, both autocommit modes,
two processes racing) runs on PostgreSQL too, in test_guard.py. Here: isolation under READ
COMMITTED, two holders in two processes racing across a pause, where the old holder's
statement must never commit after the new holder's; two first writers racing to create a
resource's mark; what REPEATABLE READ does; the caller's settings; and a machine without
PostgreSQL failing with how to install it.
"""

import multiprocessing
import queue
import threading
import traceback

import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg.rows import dict_row

# First: without psycopg this import fails with how to install it (the [postgres] extra).
from coordinator.client.pg_guard import PostgresGuard, StaleToken
from coordinator.client.proof import ProofSigner, ProofVerifier
from testsupport import guard_stores
from testsupport.guard_stores import PostgresStore
from testsupport.postgres import PostgresMissing, PostgresServer
from testsupport.supervisor import wait_until

KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])
RESOURCE = "orders/7"
# How long a racing holder waits for its cue: far above the sub-second the steps take, so a
# loaded machine does not fail the test, and still an end if a process died.
CUE_TIMEOUT_S = 60


@pytest.fixture
def dsn(postgres_server):
    return postgres_server.new_database()


# The shared helpers need only the store's SQL dialect here: connections come from ``dsn``.
PG = PostgresStore(conninfo="")


def _setup(conn, verifier=VERIFIER):
    return guard_stores.setup(PG, conn, verifier)


def _write(guard, token, proof=None):
    guard_stores.write(PG, guard, RESOURCE, token, SIGNER.sign(RESOURCE, token) if proof is None else proof)


def _written(conn):
    return guard_stores.written(PG, conn, RESOURCE)


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
    except BaseException:  # noqa: BLE001 - the child's every failure, assertions too, goes back to the test
        results.put((5, traceback.format_exc()))


def _new_holder(conninfo, public_pem, proof, done, results):
    """Token 6: writes once; ``done`` once its transaction has ended either way."""
    try:
        with psycopg.connect(conninfo) as conn:
            _write(PostgresGuard(conn, _child_verifier(public_pem)), 6, proof=proof)
        results.put((6, "committed"))
    except BaseException:  # noqa: BLE001 - the child's every failure, assertions too, goes back to the test
        results.put((6, traceback.format_exc()))
    finally:
        done.set()


def _backend_waits_for_a_lock(admin, application_name):
    with admin.transaction():
        row = admin.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


def test_an_old_holder_paused_between_check_and_statement_never_commits_after_the_new_one(dsn):
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
            except BaseException as exc:  # noqa: BLE001 - whatever ends writer b is the outcome the test thread checks
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


def test_a_machine_without_postgresql_fails_with_how_to_install_it(monkeypatch, tmp_path):
    """Never a skip: without the server binaries the fixture fails with this line."""
    import testsupport.postgres as harness

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(harness, "DEBIAN_BINDIRS", str(tmp_path / "*" / "bin"))
    with pytest.raises(PostgresMissing, match=r"apt-get install -y postgresql"):
        PostgresServer()
