"""The four stores of the guard conformance suite (tests/test_guard_conformance.py), one shape.

Owns: per store (SQLite, PostgreSQL, Redis, MariaDB) how to connect, how one fenced write looks
(two parts: a log entry and a second record, so a half-applied write is visible), how to read
them back, how a write without the guard's locking step looks (the broken variant), and how to
see that another connection waits on the guard's lock. For the SQL stores a fenced write is a
``guard.fenced`` body inserting into ``log`` and ``parts``; for Redis one ``guard.apply`` of an
RPUSH to ``{resource}:log`` and an INCRBY of ``{resource}:parts``.
Must never: be imported by ``coordinator/`` (not shipped), start a server (the tests' fixtures
do), or hide a difference a test is about. Stores are picklable, so a spawned process can open
the same database.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any, Callable

# seq numbers rows in insert order; a guard holds its lock from check to commit, so for one
# resource that is commit order too.
_TABLES = ("log", "parts")


def _nothing() -> None:
    pass


class _Sql:
    """What the three SQL stores share: the tables, the fenced body, the reads."""

    param = "%s"
    serial = "bigserial PRIMARY KEY"
    scripted = False  # the check and the write are one server-side step (Redis) or a body runs

    def setup(self, conn, verifier):
        guard = self.guard(conn, verifier)
        guard.ensure_schema()
        for table in _TABLES:
            self.execute(conn, f"CREATE TABLE IF NOT EXISTS {table} (seq {self.serial}, resource VARCHAR(300) "
                               "NOT NULL, value VARCHAR(300) NOT NULL)")
        return guard

    def write(self, guard, resource: str, proof, value: str, between: Callable[[], None] = _nothing) -> None:
        """One fenced write of ``value``; ``between`` runs after its first part, before its second."""
        p = self.param
        with guard.fenced(resource, proof) as cur:
            cur.execute(f"INSERT INTO log (resource, value) VALUES ({p}, {p})", (resource, value))
            between()
            cur.execute(f"INSERT INTO parts (resource, value) VALUES ({p}, {p})", (resource, value))

    def write_failing(self, guard, resource: str, proof, value: str) -> type[BaseException]:
        """A fenced write whose second part fails (a NOT NULL violation); the error class."""
        p = self.param
        with guard.fenced(resource, proof) as cur:
            cur.execute(f"INSERT INTO log (resource, value) VALUES ({p}, {p})", (resource, value))
            cur.execute(f"INSERT INTO parts (resource, value) VALUES ({p}, NULL)", (resource,))
        raise AssertionError("the failing write did not fail")

    def unfenced_write(self, conn, resource: str, value: str) -> None:
        """The broken variant's write: the same two parts, no guard."""
        p = self.param
        self.execute(conn, f"INSERT INTO log (resource, value) VALUES ({p}, {p})", (resource, value))
        self.execute(conn, f"INSERT INTO parts (resource, value) VALUES ({p}, {p})", (resource, value))

    def log(self, conn, resource: str) -> list[str]:
        rows = self.query(conn, f"SELECT value FROM log WHERE resource = {self.param} ORDER BY seq", (resource,))
        return [str(v) for (v,) in rows]

    def parts(self, conn, resource: str) -> list[str]:
        rows = self.query(conn, f"SELECT value FROM parts WHERE resource = {self.param} ORDER BY seq", (resource,))
        return [str(v) for (v,) in rows]


@dataclasses.dataclass(frozen=True)
class Sqlite(_Sql):
    path: str
    kind = "sqlite"
    param = "?"
    serial = "INTEGER PRIMARY KEY AUTOINCREMENT"

    def connect(self, name: str = "") -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def guard(self, conn, verifier):
        from coordinator.client.guard import SqliteGuard

        return SqliteGuard(conn, verifier)

    def query(self, conn, statement: str, params=()) -> list[tuple]:
        return conn.execute(statement, params).fetchall()

    def execute(self, conn, statement: str, params=()) -> None:
        conn.execute(statement, params)

    def in_transaction(self, conn) -> bool:
        return conn.in_transaction

    def waiting_on_lock(self, admin, name: str) -> bool | None:
        return None  # SQLite shows no lock waiters: the test gives the waiter a grace period


@dataclasses.dataclass(frozen=True)
class Postgres(_Sql):
    conninfo: str
    kind = "postgres"

    def connect(self, name: str = ""):
        import psycopg

        return psycopg.connect(self.conninfo + (f" application_name={name}" if name else ""))

    def guard(self, conn, verifier):
        from coordinator.client.pg_guard import PostgresGuard

        return PostgresGuard(conn, verifier)

    def query(self, conn, statement: str, params=()) -> list[tuple]:
        with conn.transaction():
            return conn.execute(statement, params).fetchall()

    def execute(self, conn, statement: str, params=()) -> None:
        with conn.transaction():
            conn.execute(statement, params)

    def in_transaction(self, conn) -> bool:
        from psycopg.pq import TransactionStatus

        return conn.info.transaction_status != TransactionStatus.IDLE

    def waiting_on_lock(self, admin, name: str) -> bool:
        row = self.query(admin, "SELECT wait_event_type FROM pg_stat_activity WHERE application_name = %s", (name,))
        return bool(row) and row[0][0] == "Lock"


@dataclasses.dataclass(frozen=True)
class MariaDB(_Sql):
    socket_path: str
    database: str
    isolation: str = "READ COMMITTED"
    kind = "mariadb"
    serial = "BIGINT AUTO_INCREMENT PRIMARY KEY"

    def connect(self, name: str = ""):
        import pymysql

        conn = pymysql.connect(unix_socket=self.socket_path, user="root", database=self.database,
                               connect_timeout=10, program_name=name or "tests")
        with conn.cursor() as cur:
            cur.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {self.isolation}")
            if name:  # found again by waiting_on_lock
                cur.execute("SET @fencing_test_name = %s", (name,))
        return conn

    def guard(self, conn, verifier):
        from coordinator.client.mysql_guard import MySQLGuard

        return MySQLGuard(conn, verifier)

    def query(self, conn, statement: str, params=()) -> list[tuple]:
        opened = not self.in_transaction(conn)
        with conn.cursor() as cur:
            cur.execute(statement, params)
            rows = list(cur.fetchall())
        if opened:
            conn.commit()  # a fresh snapshot next time (REPEATABLE READ would keep this one)
        return rows

    def execute(self, conn, statement: str, params=()) -> None:
        with conn.cursor() as cur:
            cur.execute(statement, params)
        conn.commit()

    def in_transaction(self, conn) -> bool:
        from pymysql.constants import SERVER_STATUS

        return bool(conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS)

    def waiting_on_lock(self, admin, name: str) -> bool:
        # A guard's statement on its table still running is one waiting for the lock: alone it
        # takes microseconds. (PROCESSLIST has no connection names, and information_schema's
        # innodb_trx is a cache that a poll every 50 ms never sees refreshed.)
        rows = self.query(
            admin,
            "SELECT COUNT(*) FROM information_schema.processlist WHERE db = %s "
            "AND id <> CONNECTION_ID() AND command = 'Query' AND info LIKE %s",
            (self.database, "%fencing_hwm%"),
        )
        return rows[0][0] > 0


@dataclasses.dataclass(frozen=True)
class Redis:
    socket_path: str
    db: int
    kind = "redis"
    scripted = True

    def connect(self, name: str = ""):
        import redis

        return redis.Redis(unix_socket_path=self.socket_path, db=self.db, socket_timeout=60,
                           client_name=name or None)

    def guard(self, conn, verifier):
        from coordinator.client.redis_guard import RedisGuard

        return RedisGuard(conn, verifier)

    setup = guard  # no schema: the hwm key is made by the first write

    @staticmethod
    def _keys(resource: str) -> tuple[str, str]:
        from coordinator.client.redis_guard import RedisGuard

        return RedisGuard.key(resource, "log"), RedisGuard.key(resource, "parts")

    def write(self, guard, resource: str, proof, value: str, between: Callable[[], None] = _nothing) -> None:
        from coordinator.client.redis_guard import Mutation

        log, parts = self._keys(resource)
        between()  # no body: the script's two mutations have nothing between them
        guard.apply(resource, proof, Mutation.rpush(log, value), Mutation.rpush(parts, value))

    def write_failing(self, guard, resource: str, proof, value: str) -> type[BaseException]:
        """The second mutation hits a key of the wrong type: the script must refuse before writing."""
        import redis

        from coordinator.client.redis_guard import Mutation

        log, parts = self._keys(resource)
        wrong = guard.key(resource, "not-a-counter")
        guard._client.hset(wrong, "field", "x")
        guard.apply(resource, proof, Mutation.rpush(log, value), Mutation.incrby(wrong, 1),
                    Mutation.rpush(parts, value))
        raise redis.ResponseError("the failing write did not fail")

    def unfenced_write(self, conn, resource: str, value: str) -> None:
        log, parts = self._keys(resource)
        conn.rpush(log, value)
        conn.rpush(parts, value)

    def log(self, conn, resource: str) -> list[str]:
        return [v.decode() for v in conn.lrange(self._keys(resource)[0], 0, -1)]

    def parts(self, conn, resource: str) -> list[str]:
        return [v.decode() for v in conn.lrange(self._keys(resource)[1], 0, -1)]

    def in_transaction(self, conn) -> bool:
        return False

    def waiting_on_lock(self, admin, name: str) -> bool:
        return any(c.get("name") == name and "b" in c.get("flags", "") for c in admin.client_list())


def failing_error(store: Any) -> type[BaseException]:
    """The error a store's ``write_failing`` raises."""
    if store.kind == "redis":
        import redis

        return redis.ResponseError
    if store.kind == "sqlite":
        return sqlite3.IntegrityError
    if store.kind == "postgres":
        import psycopg

        return psycopg.IntegrityError
    import pymysql

    return pymysql.err.IntegrityError


def unlocked_guard(store: Any, conn, verifier):
    """The store's real guard with its locking step taken out (PostgreSQL: the mark read without
    FOR UPDATE; MariaDB: neither the insert-or-lock nor FOR UPDATE): the broken variant the race
    test shows going wrong. SQLite's lock is its BEGIN IMMEDIATE transaction, Redis's the script."""
    from coordinator.client.guard_rule import Guard

    guard = store.guard(conn, verifier)
    if store.kind == "postgres":
        guard._lock_hwm = lambda resource: guard._one_hwm(guard._sql["read"], resource)
    elif store.kind == "mariadb":
        guard._admit = lambda resource, token: Guard._admit(guard, resource, token)
        guard._lock_hwm = lambda resource: guard._one_hwm("read", resource)
    else:
        raise ValueError(f"{store.kind} has no row lock to take out")
    return guard
