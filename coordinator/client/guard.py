"""The SQLite guard: the fencing rule (I3) enforced at a SQLite database.

Owns: how ``SqliteGuard`` keeps the rule of ``guard_rule.Guard`` in a ``sqlite3.Connection``:
a durable high-water mark (hwm) per resource, kept in a table of the caller's own database,
checked and raised in one ``BEGIN IMMEDIATE`` transaction with the caller's mutation.
Must never: accept a write whose token is below the resource's hwm, let the hwm and the
mutation commit separately (a raised mark without its write, or a write without its mark),
trust a token without a proof when it has a verifier, or change the caller's connection
settings. Why here and not at the coordinator: a lease can expire while its old holder is
paused, so only the resource itself, comparing and mutating in one transaction, can refuse
the old holder's late write (DESIGN §6). PostgreSQL: ``pg_guard.PostgresGuard``, the same
rule and contract.

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
"""

from __future__ import annotations

import sqlite3

from coordinator.client.exceptions import StaleToken
from coordinator.client.guard_rule import Guard

# StaleToken is the client's own (coordinator.client.exceptions): one ``except StaleToken``
# catches a refusal by the cluster's fenced store and one by a guard alike.
__all__ = ["SqliteGuard", "StaleToken"]

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


class SqliteGuard(Guard):
    """Fences writes to a SQLite database: one hwm per resource in ``table``.

    ``verifier``: see ``Guard`` (None: trusted int tokens, no proofs).

    Use a connection in the default (``isolation_level=""``) or autocommit
    (``isolation_level=None``) mode, with no transaction open when ``fenced`` is called:
    the guard opens its own. (A Python 3.12+ ``autocommit=False`` connection always has one
    open, so it is refused.)
    """

    _connection_type = sqlite3.Connection
    _connection_name = "sqlite3.Connection"
    _reserved_table_prefix = "sqlite_"
    _conn: sqlite3.Connection

    @property
    def _table(self) -> str:
        return f'"{self._table_name}"'  # quoted, so a keyword such as "order" is a name too

    def ensure_schema(self) -> None:
        """Create the hwm table if it does not exist (committed at once if no transaction is open)."""
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self._table} ("
            " resource TEXT PRIMARY KEY,"
            f" hwm TEXT NOT NULL CHECK (length(hwm) = {_TOKEN_DIGITS} AND hwm NOT GLOB '*[^0-9]*'))"
        )

    # -- the storage adapter: explicit BEGIN/COMMIT/ROLLBACK statements, not conn.commit(),
    # because they mean the same in the sqlite3 module's default and autocommit modes.

    def _in_transaction(self) -> bool:
        return self._conn.in_transaction

    def _begin(self) -> None:
        # IMMEDIATE takes the database's write lock now, before the hwm is read, and holds it
        # to the commit: that lock is what keeps another process out between check and write.
        self._conn.execute("BEGIN IMMEDIATE")

    def _read_hwm(self, resource: str) -> int | None:
        row = self._conn.execute(f"SELECT hwm FROM {self._table} WHERE resource = ?", (resource,)).fetchone()
        return None if row is None else _decode(row[0], resource)

    _lock_hwm = _read_hwm  # inside BEGIN IMMEDIATE every read is already under the write lock

    def _create_hwm(self, resource: str, token: int) -> bool:
        self._conn.execute(f"INSERT INTO {self._table} (resource, hwm) VALUES (?, ?)", (resource, _encode(token)))
        return True  # nobody else can have inserted it: the write lock has been ours since the read

    def _raise_hwm(self, resource: str, token: int) -> None:
        self._conn.execute(f"UPDATE {self._table} SET hwm = ? WHERE resource = ?", (_encode(token), resource))

    def _cursor(self) -> sqlite3.Cursor:
        return self._conn.cursor()

    def _commit(self) -> None:
        self._conn.execute("COMMIT")

    def _rollback(self) -> None:
        self._conn.execute("ROLLBACK")
