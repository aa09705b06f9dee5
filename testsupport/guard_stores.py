"""The databases a guard's contract is tested on: one test, every store (tests/test_guard.py).

Owns: per store (SQLite in either sqlite3 mode, PostgreSQL with or without autocommit) how to
connect, which guard class fences it, and the few statements whose SQL differs; plus the
helpers the tests share: a guard with its table and the caller's own ``writes`` table (one row
per accepted write, in commit order), one fenced write, the writes read back.
Must never: be imported by ``coordinator/`` (not shipped), open a server (the tests'
``postgres_server`` fixture does), or hide a difference a test is about: such a test uses the
store's driver itself. Stores are picklable, so a spawned process can open the same database.
"""

from __future__ import annotations

import dataclasses
import sqlite3

from coordinator.client.guard import SqliteGuard

# seq numbers rows in insert order; a guard holds its lock from check to commit, so for one
# resource that is commit order too.
WRITES_TABLE = "CREATE TABLE IF NOT EXISTS writes (seq {serial}, resource TEXT NOT NULL, token TEXT NOT NULL)"


@dataclasses.dataclass(frozen=True)
class SqliteStore:
    path: str
    isolation_level: str | None = ""  # "": the sqlite3 module's default mode; None: autocommit
    param = "?"

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=self.isolation_level)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def guard(self, conn, verifier, **kwargs) -> SqliteGuard:
        return SqliteGuard(conn, verifier, **kwargs)

    def in_transaction(self, conn) -> bool:
        return conn.in_transaction

    def begin(self, conn) -> None:
        conn.execute("BEGIN")

    def rollback(self, conn) -> None:
        conn.execute("ROLLBACK")

    def query(self, conn, statement: str, params=()) -> list[tuple]:
        return conn.execute(statement, params).fetchall()

    def execute(self, conn, statement: str, params=()) -> None:
        """Run and commit (unless the caller has a transaction open)."""
        conn.execute(statement, params)
        if conn.in_transaction and conn.isolation_level is not None:
            conn.commit()

    def tables(self, conn) -> set[str]:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} - {
            "sqlite_sequence"
        }

    serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
    integrity_error = sqlite3.IntegrityError


@dataclasses.dataclass(frozen=True)
class PostgresStore:
    conninfo: str
    autocommit: bool = False
    param = "%s"
    serial = "bigserial PRIMARY KEY"

    def connect(self):
        import psycopg  # only where PostgreSQL is tested: the SQLite tests run without it

        return psycopg.connect(self.conninfo, autocommit=self.autocommit)

    def guard(self, conn, verifier, **kwargs):
        from coordinator.client.pg_guard import PostgresGuard

        return PostgresGuard(conn, verifier, **kwargs)

    def in_transaction(self, conn) -> bool:
        from psycopg.pq import TransactionStatus

        return conn.info.transaction_status != TransactionStatus.IDLE

    def begin(self, conn) -> None:
        if conn.autocommit:
            conn.execute("BEGIN")
        # else: psycopg opens it with the next statement

    def rollback(self, conn) -> None:
        conn.rollback()

    def query(self, conn, statement: str, params=()) -> list[tuple]:
        with conn.transaction():  # ends here (or is a savepoint of the caller's): the connection stays as it was
            return conn.execute(statement, params).fetchall()

    def execute(self, conn, statement: str, params=()) -> None:
        with conn.transaction():
            conn.execute(statement, params)

    def tables(self, conn) -> set[str]:
        return {name for (name,) in self.query(conn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}

    @property
    def integrity_error(self):
        import psycopg

        return psycopg.IntegrityError


def setup(store, conn, verifier, **kwargs):
    """The guard's table and the caller's ``writes`` table; the guard."""
    guard = store.guard(conn, verifier, **kwargs)
    guard.ensure_schema()
    store.execute(conn, WRITES_TABLE.format(serial=store.serial))
    return guard


def write(store, guard, resource: str, token: int, proof) -> None:
    """One fenced write: a row of ``writes`` with ``token``, committed with the guard's mark."""
    with guard.fenced(resource, proof) as cur:
        cur.execute(
            f"INSERT INTO writes (resource, token) VALUES ({store.param}, {store.param})", (resource, str(token))
        )


def written(store, conn, resource: str) -> list[int]:
    """The tokens written for ``resource``, in commit order."""
    rows = store.query(conn, f"SELECT token FROM writes WHERE resource = {store.param} ORDER BY seq", (resource,))
    return [int(t) for (t,) in rows]
