"""MySQLGuard's own concerns on a real MariaDB server the tests start (the mariadb_server
fixture, testsupport.store_servers): two first writers of a resource racing under READ
COMMITTED and REPEATABLE READ (no deadlock, the second judged against the first's mark), a
waiting holder's body seeing what the previous holder committed under REPEATABLE READ, the
table's types, and the caller's settings. The contract shared with every guard (both isolation
levels) is in test_guard_conformance.py.
"""

# First: without PyMySQL this import fails with how to install it (the [mysql] extra).
import threading

import pymysql
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.client.mysql_guard import MySQLGuard, StaleToken
from coordinator.client.proof import TOKEN_MAX, ProofSigner, ProofVerifier
from testsupport import conformance_stores
from testsupport.supervisor import wait_until

KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])
R = "orders/7"
CUE_TIMEOUT_S = 60
ISOLATIONS = ["READ COMMITTED", "REPEATABLE READ"]


@pytest.fixture(params=ISOLATIONS)
def store(request, mariadb_server):
    return conformance_stores.MariaDB(mariadb_server.socket_path, mariadb_server.new_database(), request.param)


def _second_writer_behind_the_first(store, token_a, token_b, body_b=None):
    """Holder A writes ``token_a`` (the resource's first write) and, before it commits, holder B
    (another connection, in a thread) tries ``token_b`` and must wait on A's lock. Returns B's
    outcome, "committed" or the exception it raised, and what B's body read, once A committed."""
    a, b, admin = store.connect(), store.connect(), store.connect()
    guard_a, guard_b = store.setup(a, VERIFIER), MySQLGuard(b, VERIFIER)
    outcome = {}

    def second():
        try:
            with guard_b.fenced(R, SIGNER.sign(R, token_b)) as cur:
                cur.execute("SELECT value FROM log WHERE resource = %s ORDER BY seq", (R,))
                outcome["read"] = [v for (v,) in cur.fetchall()]
                cur.execute("INSERT INTO log (resource, value) VALUES (%s, %s)", (R, str(token_b)))
            outcome["b"] = "committed"
        except BaseException as exc:  # noqa: BLE001 - whatever ends writer b is the outcome the test thread checks
            outcome["b"] = exc

    with guard_a.fenced(R, SIGNER.sign(R, token_a)) as cur:
        cur.execute("INSERT INTO log (resource, value) VALUES (%s, %s)", (R, str(token_a)))
        racer = threading.Thread(target=second)
        racer.start()
        wait_until(lambda: store.waiting_on_lock(admin, ""), CUE_TIMEOUT_S,
                   what="the second writer to wait on the first one's lock")
    racer.join(CUE_TIMEOUT_S)
    assert not racer.is_alive()
    log = [v for (v,) in store.query(admin, "SELECT value FROM log WHERE resource = %s ORDER BY seq", (R,))]
    hwm = MySQLGuard(admin, VERIFIER).hwm(R)
    for c in (a, b, admin):
        c.close()
    return outcome, log, hwm


def test_two_first_writers_race_to_create_the_mark_and_the_lower_is_refused(store):
    """Neither finds a committed mark; the second's insert waits for the first, which commits 6:
    the second is judged against 6 (StaleToken), and fails neither on the duplicate key nor by a
    deadlock."""
    outcome, log, hwm = _second_writer_behind_the_first(store, 6, 5)
    assert isinstance(outcome["b"], StaleToken) and outcome["b"].hwm == 6, outcome
    assert (log, hwm) == (["6"], 6)


def test_why_the_guard_inserts_before_it_locks_under_repeatable_read(store):
    """The other order, SELECT ... FOR UPDATE on the missing row and then the insert, deadlocks
    two first writers under REPEATABLE READ (both hold the gap lock, each insert waits on the
    other's): MariaDB kills one (1213). Under READ COMMITTED there is no gap lock. The guard's
    insert-or-lock comes first, so no writer holds a gap lock the other's insert needs."""
    a, b = store.connect(), store.connect()
    store.setup(a, VERIFIER)
    for c in (a, b):
        c.begin()
        with c.cursor() as cur:
            cur.execute("SELECT hwm FROM fencing_hwm WHERE resource = %s FOR UPDATE", (R.encode(),))
    errors = []

    def insert(c, token):
        try:
            with c.cursor() as cur:
                cur.execute("INSERT INTO fencing_hwm VALUES (%s, %s)", (R.encode(), token))
            c.rollback()
        except pymysql.err.MySQLError as exc:
            errors.append(exc.args[0])
            c.rollback()

    threads = [threading.Thread(target=insert, args=(c, t)) for c, t in ((a, 5), (b, 6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CUE_TIMEOUT_S)
    if store.isolation == "REPEATABLE READ":
        assert 1213 in errors, errors  # ER_LOCK_DEADLOCK
    else:
        assert 1213 not in errors, errors
    a.close()
    b.close()


def test_a_waiting_holder_reads_what_the_previous_holder_committed(store):
    """Under REPEATABLE READ too: the guard takes its lock before any consistent read, so the
    body's snapshot starts after the previous holder's commit and its write is not lost."""
    outcome, log, hwm = _second_writer_behind_the_first(store, 5, 6)
    assert outcome["b"] == "committed" and outcome["read"] == ["5"], outcome
    assert (log, hwm) == (["5", "6"], 6)


def test_table_types_and_settings(store):
    conn = store.connect()
    guard = store.setup(conn, None)
    with conn.cursor() as cur:
        cur.execute("SELECT @@autocommit, @@tx_isolation")
        before = cur.fetchone()
    conn.commit()
    store.write(guard, "a", TOKEN_MAX, "x")
    store.write(guard, "A", 1, "y")  # bytes, not a case-insensitive collation: another resource
    assert (guard.hwm("a"), guard.hwm("A")) == (TOKEN_MAX, 1)
    columns = store.query(conn, "SELECT column_name, column_type FROM information_schema.columns "
                                "WHERE table_schema = DATABASE() AND table_name = 'fencing_hwm' ORDER BY 1")
    assert columns == [("hwm", "decimal(20,0)"), ("resource", "varbinary(256)")]
    assert store.query(conn, "SELECT engine FROM information_schema.tables WHERE table_schema = DATABASE() "
                             "AND table_name = 'fencing_hwm'") == [("InnoDB",)]
    with conn.cursor() as cur:
        cur.execute("SELECT @@autocommit, @@tx_isolation")
        assert cur.fetchone() == before
    conn.commit()
    conn.close()


def test_ensure_schema_refuses_to_commit_the_callers_transaction(store):
    conn = store.connect()
    store.setup(conn, VERIFIER)
    conn.begin()
    with conn.cursor() as cur:
        cur.execute("INSERT INTO log (resource, value) VALUES ('caller', '1')")
    with pytest.raises(RuntimeError, match="would commit it"):
        MySQLGuard(conn, VERIFIER, table="other").ensure_schema()
    conn.rollback()
    assert store.log(conn, "caller") == []
    conn.close()


def test_a_dict_cursor_connection_and_autocommit_work_too(mariadb_server):
    db = mariadb_server.new_database()
    conn = pymysql.connect(**mariadb_server.connect_args(db), cursorclass=pymysql.cursors.DictCursor,
                           autocommit=True)
    guard = MySQLGuard(conn, VERIFIER)
    guard.ensure_schema()
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE t (id INT PRIMARY KEY, state VARCHAR(20))")
    with guard.fenced(R, SIGNER.sign(R, 2)) as cur:
        cur.execute("INSERT INTO t VALUES (7, 'packed')")
        cur.execute("SELECT state FROM t WHERE id = 7")
        assert cur.fetchone() == {"state": "packed"}  # the body's cursor is the caller's kind
    assert guard.hwm(R) == 2 and conn.get_autocommit()
    with pytest.raises(StaleToken):
        with guard.fenced(R, SIGNER.sign(R, 1)) as cur:
            cur.execute("UPDATE t SET state = 'cancelled'")
    with conn.cursor() as cur:
        cur.execute("SELECT state FROM t")
        assert cur.fetchall() == [{"state": "packed"}]
    conn.close()
