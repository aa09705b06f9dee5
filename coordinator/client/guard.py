"""Guard helpers for external stores: the fencing rule (I3) enforced at a SQL database.

Owns: a durable high-water mark (hwm) per resource, kept in a table of the caller's own
database, and the check-and-raise of that mark in the same transaction as the caller's
mutation. ``SqliteGuard`` does it for a ``sqlite3.Connection``.
Must never: accept a write whose token is below the resource's hwm, let the hwm and the
mutation commit separately (a raised mark without its write, or a write without its mark),
trust a token without a proof when it has a verifier, or change the caller's connection
settings. Why here and not at the coordinator: a lease can expire while its old holder is
paused, so only the resource itself, comparing and mutating in one transaction, can refuse
the old holder's late write (DESIGN §6).

The rule, per resource: token < hwm is refused (``StaleToken``, the client's own class, with
``resource``, ``token`` and ``hwm``); token == hwm is accepted (one holder writes many times
in its epoch); token > hwm is accepted and raises hwm to it.
A token counts only if a valid proof (``coordinator.client.proof``) shows the coordinator issued
it for that resource; without that check one made-up huge token would lock real holders
out for good.

    guard = SqliteGuard(conn, ProofVerifier.from_files("cluster.pub"))
    guard.ensure_schema()
    with guard.fenced("orders/7", proof) as cur:   # StaleToken / InvalidProof before the body
        cur.execute("UPDATE orders SET total = ? WHERE id = 7", (42,))
    # committed here, together with the hwm; any exception in the body rolls both back

Durability of the hwm is the database's: the guard does not touch ``journal_mode`` or
``synchronous``. Use ``PRAGMA synchronous=FULL`` (in WAL mode NORMAL may lose the last
commits on power loss: then the newer holder's acknowledged write and its hwm raise are
gone, and the older holder's next write is accepted again). The busy timeout is the
connection's too (``sqlite3.connect(..., timeout=...)``): a guard waits for another
writer's transaction to end for that long, then ``sqlite3.OperationalError``.

PostgreSQL, the same rule as a recipe (NOT tested here: there is no PostgreSQL on the
machine that runs these tests). ``bigint`` is signed, so tokens go in ``numeric(20,0)``;
verify the proof in the application first, then in one transaction::

    CREATE TABLE fencing_hwm (resource text PRIMARY KEY, hwm numeric(20,0) NOT NULL);

    BEGIN;
    INSERT INTO fencing_hwm AS f (resource, hwm) VALUES ($1, $2)
        ON CONFLICT (resource) DO UPDATE SET hwm = excluded.hwm
        WHERE f.hwm <= excluded.hwm
        RETURNING hwm;
    -- no row returned: the token is stale (hwm > $2): ROLLBACK and refuse.
    -- one row: the row stays locked until COMMIT, so do the mutation, then COMMIT.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator

from coordinator.core import validation
from coordinator.core.limits import TOKEN_MAX
from coordinator.client.exceptions import StaleToken
from coordinator.client.proof import ProofVerifier

# StaleToken is the client's own (coordinator.client.exceptions): one ``except StaleToken``
# catches a refusal by the cluster's fenced store and one by a guard alike.
__all__ = ["SqliteGuard", "StaleToken"]

_TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}", re.ASCII)
_TOKEN_DIGITS = 20  # len(str(2**64 - 1))


# Tokens are uint64 but SQLite's INTEGER is signed 64-bit, and a column of INTEGER affinity
# would turn digit text into INTEGER (and anything above 2**63-1 into a lossy REAL). So the
# hwm is TEXT, zero-padded to 20 digits: fixed width makes text order equal number order,
# and it stays readable in the sqlite3 shell (a big-endian BLOB would work too, unreadably).
def _encode(token: int) -> str:
    return f"{token:0{_TOKEN_DIGITS}d}"


def _decode(value: object, resource: str) -> int:
    if not (isinstance(value, str) and len(value) == _TOKEN_DIGITS and value.isascii() and value.isdigit()):
        raise ValueError(f"hwm of {resource!r} is {value!r}, not {_TOKEN_DIGITS} digits: table damaged?")
    return int(value)


class SqliteGuard:
    """Fences writes to a SQLite database: one hwm per resource in ``table``.

    ``verifier`` checks each token's proof. With ``verifier=None`` the guard takes plain
    int tokens and believes them: only for trusted callers, because one made-up huge token
    (``2**64-1``) then locks every real holder out of that resource for good.

    Use a connection in the default (``isolation_level=""``) or autocommit
    (``isolation_level=None``) mode, with no transaction open when ``fenced`` is called:
    the guard opens its own. (A Python 3.12+ ``autocommit=False`` connection always has one
    open, so it is refused.)
    """

    def __init__(
        self, connection: sqlite3.Connection, verifier: ProofVerifier | None, *, table: str = "fencing_hwm"
    ) -> None:
        if not isinstance(connection, sqlite3.Connection):
            raise TypeError(f"connection must be a sqlite3.Connection, not {type(connection).__name__}")
        if verifier is not None and not isinstance(verifier, ProofVerifier):
            raise TypeError(f"verifier must be a ProofVerifier or None, not {type(verifier).__name__}")
        if not isinstance(table, str) or _TABLE_RE.fullmatch(table) is None:
            raise ValueError(f"table name {table!r} must match [A-Za-z_][A-Za-z0-9_]* (at most 63 characters)")
        if table.lower().startswith("sqlite_"):
            raise ValueError(f"table name {table!r}: names starting with 'sqlite_' are reserved by SQLite")
        self._conn = connection
        self._verifier = verifier
        self._table = f'"{table}"'  # quoted, so a keyword such as "order" is a name too

    def ensure_schema(self) -> None:
        """Create the hwm table if it does not exist (committed at once if no transaction is open)."""
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self._table} ("
            " resource TEXT PRIMARY KEY,"
            f" hwm TEXT NOT NULL CHECK (length(hwm) = {_TOKEN_DIGITS} AND hwm NOT GLOB '*[^0-9]*'))"
        )

    def hwm(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or None if it has never been written."""
        self._check_resource(resource)
        row = self._conn.execute(f"SELECT hwm FROM {self._table} WHERE resource = ?", (resource,)).fetchone()
        return None if row is None else _decode(row[0], resource)

    @contextlib.contextmanager
    def fenced(self, resource: str, proof: bytes | str | int) -> Iterator[sqlite3.Cursor]:
        """One fenced transaction: refuse or accept the token, then the body's mutation.

        Raises InvalidProof (from the verifier) or StaleToken before the body runs, with
        nothing changed. Otherwise the hwm is raised if the token is higher, the body gets
        a cursor in the same ``BEGIN IMMEDIATE`` transaction (the write lock is held from
        the hwm read to the commit, so another process cannot slip in between), and the
        whole is committed on normal exit or rolled back on any exception.
        """
        self._check_resource(resource)
        token = self._token(resource, proof)
        conn = self._conn
        if conn.in_transaction:
            raise RuntimeError(
                "the connection is already in a transaction: commit or roll back first, "
                "the guard's check and the mutation must be one transaction of their own"
            )
        # Explicit BEGIN/COMMIT/ROLLBACK statements, not conn.commit(): they mean the same in
        # the sqlite3 module's default and autocommit modes.
        conn.execute("BEGIN IMMEDIATE")
        try:
            hwm = self.hwm(resource)
            if hwm is not None and token < hwm:
                raise StaleToken.at_guard(resource, token, hwm)
            if hwm is None:
                conn.execute(f"INSERT INTO {self._table} (resource, hwm) VALUES (?, ?)", (resource, _encode(token)))
            elif token > hwm:
                conn.execute(f"UPDATE {self._table} SET hwm = ? WHERE resource = ?", (_encode(token), resource))
            yield conn.cursor()
            if not conn.in_transaction:
                raise RuntimeError(
                    "the fenced body ended the guard's transaction itself (commit/rollback): "
                    "leave that to the guard, so the mutation and the hwm commit as one"
                )
            conn.execute("COMMIT")
        except BaseException:
            # SQLite may already have rolled back on some errors (SQLITE_FULL, IOERR).
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _check_resource(self, resource: object) -> None:
        if not isinstance(resource, str):
            raise TypeError(f"resource must be a str, not {type(resource).__name__}")
        try:
            validation.check_resource(resource)  # the coordinator issues tokens for no other name
        except validation.InvalidField as exc:
            raise ValueError(str(exc)) from None

    def _token(self, resource: str, proof: object) -> int:
        if self._verifier is not None:
            if not isinstance(proof, (bytes, bytearray, str)):
                raise TypeError(
                    f"this guard checks signed proofs: pass the proof as bytes or text, not {type(proof).__name__}"
                )
            return self._verifier.verify(proof, resource=resource).token
        if not validation.is_int(proof):
            raise TypeError(f"a guard without a verifier takes the token as an int, not {type(proof).__name__}")
        if not 0 < proof <= TOKEN_MAX:
            raise ValueError(f"token {proof} is outside 1..2**64-1")
        return int(proof)
