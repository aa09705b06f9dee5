"""Shared pytest setup: make the package importable here and in spawned node processes.

Real-process tests start ``python -m testsupport.node_process``; without an
installed package that only works from the repository root, so the root goes on
``sys.path`` and ``PYTHONPATH`` wherever pytest was started from.
"""

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if ROOT not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *_paths])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a cluster fixture reports the tail of every member's log.

    A real-process failure that does not come back in isolation (a timeout under load, say)
    is otherwise left with nothing to read; the logs are still on disk at this point.
    """
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    from testsupport.supervisor import Supervisor

    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, Supervisor):
            report.sections.append((f"member logs ({name})", value.logs(tail=MEMBER_LOG_TAIL_CHARS)))


# Per member, in a failure report: enough for the last election or two, not a whole run.
MEMBER_LOG_TAIL_CHARS = 20_000


@pytest.fixture(autouse=True, scope="module")
def _chaos_clusters_closed():
    """A ChaosCluster left open keeps this process's claim on the network namespace
    (chaos/netns_claim.py) for the rest of the session, and every later ``python -m chaos run``
    a test starts would be refused: the module that left one open fails here instead."""
    yield
    claim = sys.modules.get("chaos.netns_claim")
    if claim is not None and claim.held():
        pytest.fail("a ChaosCluster (or a chaos Run) this module opened was never closed: it still "
                    "holds the network namespace's chaos claim")


def pytest_sessionfinish(session, exitstatus):
    """In CI every test must run: a skip there (a missing package, say) fails the run."""
    if os.environ.get("CI") != "true" or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        names = ", ".join(report.nodeid for report in skipped)
        print(f"\nCI=true: {len(skipped)} test(s) skipped, which CI does not allow: {names}", file=sys.stderr)
        session.exitstatus = 1


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server (testsupport.postgres) for the guard tests, started once.
    Missing binaries or driver fail the test with how to install them, never skip it."""
    from testsupport.postgres import PostgresMissing, PostgresServer

    if importlib.util.find_spec("psycopg") is None:
        pytest.fail("psycopg is not installed: pip install -e '.[server,test]' (the test extra includes it)")
    try:
        server = PostgresServer()
    except PostgresMissing as exc:
        pytest.fail(str(exc))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _store_server(kind: str, driver: str):
    """A throwaway Redis or MariaDB server (testsupport.store_servers), or the test fails saying
    what to install: a missing binary or driver is never a skip."""
    from testsupport import store_servers

    if importlib.util.find_spec(driver) is None:
        pytest.fail(f"{driver} is not installed: pip install -e '.[server,test]' (the test extra includes it)")
    try:
        return store_servers.RedisServer() if kind == "redis" else store_servers.MariaDBServer()
    except store_servers.ServerMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def redis_server():
    """A throwaway redis-server on a unix socket, started once for the guard tests."""
    server = _store_server("redis", "redis")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mariadb_server():
    """A throwaway MariaDB server (mariadbd) on a unix socket, started once for the guard tests."""
    server = _store_server("mariadb", "pymysql")
    try:
        server.start()
        yield server
    finally:
        server.stop()
