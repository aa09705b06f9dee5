"""One contract, every guard: SQLite, PostgreSQL, Redis and MariaDB, each on a real server the
tests start (the postgres_server, redis_server and mariadb_server fixtures; a missing server
fails the test with how to install it).

A fenced write here has two parts (testsupport.conformance_stores): for the SQL guards a body
inserting into ``log`` and ``parts``, for Redis one script call pushing to both lists; so a
write applied by half shows as ``log != parts``. The suite checks the rule's cases, malformed
and enormous tokens, proofs, the two-holder race across a pause (and the same race without the
guard's locking step, which goes wrong), several processes writing at once against a model,
a write that fails in its middle, and a connection lost in its middle.
"""

import multiprocessing
import os
import queue
import signal
import time
import traceback

import msgpack
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.client.exceptions import StaleToken
from coordinator.client.proof import PROOF_BYTES_MAX, TOKEN_MAX, InvalidProof, ProofSigner, ProofVerifier
from testsupport import conformance_stores as stores
from testsupport.supervisor import wait_until

KEY = Ed25519PrivateKey.generate()
SIGNER = ProofSigner(KEY)
VERIFIER = ProofVerifier([KEY.public_key()])
PUBLIC_PEM = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
RESOURCE = "orders/7"
STORES = ["sqlite", "postgres", "redis", "mariadb-read-committed", "mariadb-repeatable-read"]
# How long a process waits for its cue: far above the sub-second the steps take, so a loaded
# machine does not fail the test, and still an end if a process died.
CUE_TIMEOUT_S = 60
# SQLite shows no lock waiters: a waiter that has not finished after this long is taken as waiting.
SQLITE_WAIT_GRACE_S = 0.5


def _store(kind, tmp_path, request):
    if kind == "sqlite":
        return stores.Sqlite(str(tmp_path / "store.db"))
    if kind == "postgres":
        return stores.Postgres(request.getfixturevalue("postgres_server").new_database())
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        return stores.Redis(server.socket_path, server.new_database())
    server = request.getfixturevalue("mariadb_server")
    isolation = "READ COMMITTED" if kind == "mariadb-read-committed" else "REPEATABLE READ"
    return stores.MariaDB(server.socket_path, server.new_database(), isolation)


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    return _store(request.param, tmp_path, request)


@pytest.fixture
def conn(store):
    c = store.connect()
    yield c
    c.close()


@pytest.fixture
def guard(store, conn):
    return store.setup(conn, VERIFIER)


def _write(store, guard, token, resource=RESOURCE, proof=None, value=None):
    proof = SIGNER.sign(resource, token) if proof is None else proof
    store.write(guard, resource, proof, str(token) if value is None else value)


def _log(store, conn, resource=RESOURCE):
    """The values written, in commit order; and never a write applied by half."""
    log = store.log(conn, resource)
    assert log == store.parts(conn, resource), "a write was applied by half"
    return log


# -- the rule -------------------------------------------------------------------------------


def test_lower_is_refused_equal_accepted_higher_raises(store, conn, guard):
    assert guard.hwm(RESOURCE) is None
    _write(store, guard, 5)
    _write(store, guard, 5)  # one holder writes many times in its epoch
    assert guard.hwm(RESOURCE) == 5
    _write(store, guard, 6)
    assert guard.hwm(RESOURCE) == 6
    with pytest.raises(StaleToken) as info:
        _write(store, guard, 5)
    assert (info.value.resource, info.value.token, info.value.hwm) == (RESOURCE, 5, 6)
    assert _log(store, conn) == ["5", "5", "6"]
    assert guard.hwm(RESOURCE) == 6
    assert not store.in_transaction(conn)


def test_resources_are_fenced_independently(store, conn, guard):
    _write(store, guard, 9, resource="a")
    _write(store, guard, 2, resource="b")
    assert (guard.hwm("a"), guard.hwm("b")) == (9, 2)
    with pytest.raises(StaleToken):
        _write(store, guard, 1, resource="b")
    assert (_log(store, conn, "a"), _log(store, conn, "b")) == (["9"], ["2"])


def test_tokens_above_2_63_and_the_largest_compare_as_numbers(store, conn, guard):
    """9 then 10 (text order would differ), above the signed 64-bit range, and 2**64-1."""
    for token in (9, 10, 2**53 + 1, 2**63 - 1, 2**63, TOKEN_MAX - 1, TOKEN_MAX):
        _write(store, guard, token)
        assert guard.hwm(RESOURCE) == token
    for stale in (9, 2**53, 2**63, TOKEN_MAX - 1):
        with pytest.raises(StaleToken) as info:
            _write(store, guard, stale)
        assert info.value.hwm == TOKEN_MAX
    assert _log(store, conn) == [str(t) for t in (9, 10, 2**53 + 1, 2**63 - 1, 2**63, TOKEN_MAX - 1, TOKEN_MAX)]


@pytest.mark.parametrize(
    "token, error",
    [(True, TypeError), (0, ValueError), (-1, ValueError), (TOKEN_MAX + 1, ValueError), (10**400, ValueError),
     ("7", TypeError), (7.0, TypeError), (None, TypeError), (b"\x07", TypeError)],
    ids=["bool", "zero", "negative", "2**64", "enormous", "str", "float", "none", "bytes"],
)
def test_a_malformed_or_enormous_token_is_refused_and_changes_nothing(store, conn, token, error):
    guard = store.setup(conn, None)  # trusted mode: the int is the token
    _write(store, guard, 3, proof=3)
    with pytest.raises(error, match="token"):
        _write(store, guard, 7, proof=token)
    assert guard.hwm(RESOURCE) == 3
    assert _log(store, conn) == ["3"]
    assert not store.in_transaction(conn)


# -- proofs ---------------------------------------------------------------------------------


def _edited_token(token):
    fields = msgpack.unpackb(SIGNER.sign(RESOURCE, 5), raw=False)
    fields[3] = token
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    "proof, reason",
    [(lambda: ProofSigner(Ed25519PrivateKey.generate()).sign(RESOURCE, TOKEN_MAX), "unknown_key"),
     (lambda: _edited_token(TOKEN_MAX), "bad_signature"),
     (lambda: SIGNER.sign("orders/8", TOKEN_MAX), "wrong_resource"),
     (lambda: b"\x95" + b"\xff" * 40, "malformed"),
     (lambda: b"\x00" * (PROOF_BYTES_MAX + 1), "malformed"),
     (lambda: "fp1." + "A" * (4 * PROOF_BYTES_MAX), "malformed")],
    ids=["forged-other-key", "forged-edited-token", "another-resource", "garbage", "enormous", "enormous-text"],
)
def test_a_proof_not_issued_for_this_resource_changes_nothing(store, conn, guard, proof, reason):
    _write(store, guard, 5)
    with pytest.raises(InvalidProof) as info:
        _write(store, guard, TOKEN_MAX, proof=proof())
    assert info.value.reason == reason
    assert guard.hwm(RESOURCE) == 5 and guard.hwm("orders/8") is None
    _write(store, guard, 5)  # the real holder still writes
    assert _log(store, conn) == ["5", "5"]


def test_a_valid_proof_in_text_form_is_accepted(store, conn, guard):
    from coordinator.client.proof import to_text

    _write(store, guard, 4, proof=to_text(SIGNER.sign(RESOURCE, 4)))
    assert guard.hwm(RESOURCE) == 4 and _log(store, conn) == ["4"]


# -- a write failing or its connection lost in the middle -------------------------------------


def test_a_write_that_fails_in_its_middle_leaves_nothing(store, conn, guard):
    _write(store, guard, 5)
    with pytest.raises(stores.failing_error(store)):
        store.write_failing(guard, RESOURCE, SIGNER.sign(RESOURCE, 6), "6")
    assert guard.hwm(RESOURCE) == 5  # the hwm raise went with the failed write
    assert _log(store, conn) == ["5"]
    assert not store.in_transaction(conn)
    _write(store, guard, 5)  # the holder of 5 is not fenced off by a write that never happened
    assert _log(store, conn) == ["5", "5"]


def _verifier(pem):
    # A spawned child imports this module afresh, with a KEY of its own: it gets the parent's.
    return ProofVerifier([serialization.load_pem_public_key(pem)])


class _Boom(Exception):
    pass


@pytest.mark.parametrize("error", [_Boom, KeyboardInterrupt])
def test_a_body_that_raises_commits_nothing(store, conn, guard, error):
    """SQL: the body raises after its first statement. Redis has no body: the caller's code
    raising before the call sends nothing, which is the same promise."""
    _write(store, guard, 5)

    def boom():
        raise error()

    with pytest.raises(error):
        store.write(guard, RESOURCE, SIGNER.sign(RESOURCE, 6), "6", between=boom)
    assert guard.hwm(RESOURCE) == 5
    assert _log(store, conn) == ["5"]
    assert not store.in_transaction(conn)


def _dies_in_the_middle(store, pem, proof, inside, results):
    """A fenced write of 6 that stops after its first part and is killed there."""
    try:
        conn = store.connect("dying")
        guard = store.guard(conn, _verifier(pem))

        if store.scripted:
            inside.set()  # the test holds the server's writes back: the script waits, and is killed there
            store.write(guard, RESOURCE, proof, "6")
        else:
            def hang():
                inside.set()
                time.sleep(CUE_TIMEOUT_S)  # killed here by the test

            store.write(guard, RESOURCE, proof, "6", between=hang)
        results.put("finished")
    except BaseException:  # noqa: BLE001 - the child's every failure, assertions too, goes back to the test
        results.put(traceback.format_exc())


def test_a_connection_lost_in_the_middle_of_a_write_leaves_nothing(store, conn, guard):
    """The writer's process is killed mid-write (SQL: between the body's two statements, its
    transaction open; Redis: its script sent while the server holds writes back). The store must
    apply none of it: no part, no hwm raise, no lock left behind."""
    _write(store, guard, 5)
    ctx = multiprocessing.get_context("spawn")
    inside, results = ctx.Event(), ctx.Queue()
    admin = store.connect()
    if store.scripted:
        admin.client_pause(CUE_TIMEOUT_S * 1000, all=False)  # writes wait; the killed one never runs
    proc = ctx.Process(target=_dies_in_the_middle, args=(store, PUBLIC_PEM, SIGNER.sign(RESOURCE, 6), inside, results))
    proc.start()
    try:
        assert inside.wait(CUE_TIMEOUT_S), f"the writer never got inside its write: {_report(results)}"
        if store.scripted:
            wait_until(lambda: store.waiting_on_lock(admin, "dying"), CUE_TIMEOUT_S, what="the script to be held")
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(CUE_TIMEOUT_S)
    finally:
        if store.scripted:
            wait_until(lambda: not any(c.get("name") == "dying" for c in admin.client_list()), CUE_TIMEOUT_S,
                       what="the server to notice the killed client")
            admin.client_unpause()
        admin.close()
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == -signal.SIGKILL
    assert guard.hwm(RESOURCE) == 5
    assert _log(store, conn) == ["5"]
    _write(store, guard, 5)  # nothing left locked, and 5 is still current
    assert _log(store, conn) == ["5", "5"]


def _report(results):
    try:
        return results.get(timeout=1)
    except queue.Empty:
        return "(no report)"


# -- two holders across a pause -------------------------------------------------------------


def _old_holder(store, pem, proof, checked, go, results, broken):
    """Token 5, writing again in its epoch, held between its check and its write until ``go``.
    ``broken``: "check-then-write", the guard's rule without its locking step (a plain read of
    the mark, then the write), which is what every guard exists to prevent; "unlocked", the SQL
    guard itself with its row lock taken out."""
    try:
        conn = store.connect("holder5")
        if broken == "unlocked":
            guard = stores.unlocked_guard(store, conn, _verifier(pem))
        else:
            guard = store.guard(conn, _verifier(pem))
        if broken == "check-then-write":
            hwm = guard.hwm(RESOURCE)
            assert hwm is not None and 5 >= hwm
            checked.set()
            assert go.wait(CUE_TIMEOUT_S), "never told to go on"
            store.unfenced_write(conn, RESOURCE, "5")
        elif store.scripted and broken is None:
            checked.set()  # the test holds the server's writes back: the script waits there
            store.write(guard, RESOURCE, proof, "5")
        else:
            def pause():
                checked.set()
                assert go.wait(CUE_TIMEOUT_S), "never told to go on"

            store.write(guard, RESOURCE, proof, "5", between=pause)
        results.put((5, "committed"))
    except BaseException:  # noqa: BLE001 - the child's every failure, assertions too, goes back to the test
        results.put((5, traceback.format_exc()))


def _new_holder(store, pem, proof, attempting, done, results):
    try:
        conn = store.connect("holder6")
        attempting.set()
        store.write(store.guard(conn, _verifier(pem)), RESOURCE, proof, "6")
        results.put((6, "committed"))
    except BaseException:  # noqa: BLE001 - the child's every failure, assertions too, goes back to the test
        results.put((6, traceback.format_exc()))
    finally:
        done.set()


def _race(store, conn, guard, broken):
    """Holder 5 has written; it starts a second write and pauses between check and write (Redis:
    the check and the write are one script, so the pause is the server holding the script back);
    holder 6 arrives meanwhile. The tokens written, in commit order."""
    _write(store, guard, 5)
    ctx = multiprocessing.get_context("spawn")
    checked, go, attempting, done, results = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    old = ctx.Process(
        target=_old_holder, args=(store, PUBLIC_PEM, SIGNER.sign(RESOURCE, 5), checked, go, results, broken)
    )
    new = ctx.Process(target=_new_holder, args=(store, PUBLIC_PEM, SIGNER.sign(RESOURCE, 6), attempting, done, results))
    admin = store.connect()
    paused = store.scripted and broken is None
    if paused:
        admin.client_pause(CUE_TIMEOUT_S * 1000, all=False)
    try:
        old.start()
        assert checked.wait(CUE_TIMEOUT_S), f"holder 5 never passed its check: {_report(results)}"
        if paused:
            wait_until(lambda: store.waiting_on_lock(admin, "holder5"), CUE_TIMEOUT_S, what="holder 5's script held")
        new.start()
        if broken:  # nothing should hold holder 6 up: its end is what to wait for
            done.wait(CUE_TIMEOUT_S)
        elif store.kind == "sqlite":
            # SQLite shows no lock waiters: a holder 6 not done after the grace period is waiting.
            assert attempting.wait(CUE_TIMEOUT_S), f"holder 6 never started: {_report(results)}"
            done.wait(SQLITE_WAIT_GRACE_S)
        else:
            wait_until(lambda: done.is_set() or store.waiting_on_lock(admin, "holder6"), CUE_TIMEOUT_S,
                       what="holder 6 to wait on the guard or finish")
        new_finished_during_the_pause = done.is_set()
        go.set()
        if paused:
            admin.client_unpause()
        try:
            reports = dict(results.get(timeout=CUE_TIMEOUT_S) for _ in range(2))
        except queue.Empty:
            pytest.fail(f"a holder did not report within {CUE_TIMEOUT_S} s")
    finally:
        go.set()
        if paused:
            admin.client_unpause()
        admin.close()
        for p in (old, new):
            if p.pid is not None:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    assert reports == {5: "committed", 6: "committed"}, reports
    # The order of each write's second part, made after the pause: the order the writes were
    # made in. (Its first part, made before the pause, says when each holder began.)
    assert sorted(store.log(conn, RESOURCE)) == sorted(store.parts(conn, RESOURCE))
    return [int(v) for v in store.parts(conn, RESOURCE)], new_finished_during_the_pause


def test_two_holders_across_a_pause_land_in_token_order(store, conn, guard):
    tokens, new_finished_during_the_pause = _race(store, conn, guard, broken=None)
    assert tokens == [5, 5, 6]
    assert _log(store, conn) == ["5", "5", "6"]  # and both parts of each write in that order
    assert not new_finished_during_the_pause, "holder 6 committed while holder 5 sat between check and write"
    assert guard.hwm(RESOURCE) == 6


def test_without_the_locking_step_the_old_holder_lands_after_the_new_one(store, conn, guard):
    """The broken variant: the same race, the mark read without the lock (or outside the
    script). Holder 6 is not held up, and holder 5's write lands after it: what the guards stop."""
    tokens, new_finished_during_the_pause = _race(store, conn, guard, broken="check-then-write")
    assert new_finished_during_the_pause
    assert tokens == [5, 6, 5]


@pytest.mark.parametrize("kind", ["postgres", "mariadb-read-committed", "mariadb-repeatable-read"])
def test_the_sql_guard_without_its_row_lock_lets_the_old_holder_land_last(kind, tmp_path, request):
    """The guard's own code, only its row lock taken out: the same race goes wrong. So the
    [5, 5, 6] above is the lock's doing, not the test's timing."""
    store = _store(kind, tmp_path, request)
    conn = store.connect()
    tokens, new_finished_during_the_pause = _race(store, conn, store.setup(conn, VERIFIER), broken="unlocked")
    assert new_finished_during_the_pause
    assert tokens == [5, 6, 5]
    conn.close()


# -- several processes writing at once, against a model --------------------------------------

WRITERS = 3
_worker_state: dict = {}


def _worker_init(public_pem):
    _worker_state["verifier"] = ProofVerifier([serialization.load_pem_public_key(public_pem)])


def _worker_run(store, writer, resource, steps):
    """Writer ``writer``'s writes, in order: [(token, proof)] -> [(value, accepted)]."""
    key = (store, writer)
    if key not in _worker_state:
        conn = store.connect(f"writer{writer}")
        _worker_state[key] = store.guard(conn, _worker_state["verifier"])
    guard = _worker_state[key]
    out = []
    for seq, (token, proof) in enumerate(steps):
        value = f"{token}:{writer}:{seq}"
        try:
            store.write(guard, resource, proof, value)
            out.append((value, True))
        except StaleToken as exc:
            assert exc.hwm > token, exc
            out.append((value, False))
    return out


@pytest.fixture(scope="module")
def worker_pool():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WRITERS, initializer=_worker_init, initargs=(PUBLIC_PEM,)) as pool:
        yield pool


_examples = iter(range(10**9))
TOKENS = st.integers(1, 6) | st.sampled_from([2**63, TOKEN_MAX])


@pytest.mark.parametrize("kind", STORES)
def test_concurrent_writers_in_several_processes_match_the_model(kind, tmp_path, request, worker_pool):
    """Three processes write token sequences to one resource at once. Whatever the interleaving,
    the store must look like one writer at a time applying the rule in its commit order: every
    accepted write is there once, no refused one is, tokens never decrease along the log, each
    writer's writes keep its order, every refusal had a higher token before it, and the hwm is
    the log's last token."""
    store = _store(kind, tmp_path, request)
    conn = store.connect()
    store.setup(conn, VERIFIER)

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.lists(TOKENS, min_size=1, max_size=6), min_size=WRITERS, max_size=WRITERS))
    def run(plans):
        resource = f"model/{next(_examples)}"
        jobs = [worker_pool.apply_async(_worker_run, (store, w, resource,
                                                      [(t, SIGNER.sign(resource, t)) for t in plan]))
                for w, plan in enumerate(plans)]
        outcomes = [job.get(CUE_TIMEOUT_S) for job in jobs]
        log = _log(store, conn, resource)
        accepted = [v for outcome in outcomes for v, ok in outcome if ok]
        refused = [v for outcome in outcomes for v, ok in outcome if not ok]
        assert sorted(log) == sorted(accepted) and not set(log) & set(refused)
        tokens = [int(v.split(":")[0]) for v in log]
        assert tokens == sorted(tokens), f"a lower token landed after a higher one: {log}"
        for writer in range(WRITERS):
            mine = [v for v in log if v.split(":")[1] == str(writer)]
            assert mine == [v for v, ok in outcomes[writer] if ok]
        for v in refused:
            assert tokens and max(tokens) > int(v.split(":")[0])
        hwm = store.guard(conn, VERIFIER).hwm(resource)
        assert hwm == (tokens[-1] if tokens else None)

    run()
    conn.close()
