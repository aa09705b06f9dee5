"""The PostgreSQL guard: the fencing rule (I3) enforced at a PostgreSQL database (psycopg 3).

Owns: how ``PostgresGuard`` keeps the rule of ``guard_rule.Guard`` in a ``psycopg.Connection``:
a durable high-water mark (hwm) per resource in a table of the caller's own database, read
with ``SELECT ... FOR UPDATE`` and raised in the same transaction as the caller's statement.
Must never: accept a write whose token is below the resource's hwm, let the hwm and the
mutation commit separately, trust a token without a proof when it has a verifier, or change
the caller's connection settings (autocommit, isolation level, row factory).

Why the row lock and not just a read: under READ COMMITTED (PostgreSQL's default) a plain
``SELECT`` does not stop another transaction from raising the mark between this one's check
and its commit, so an old holder paused there would commit after the new one. ``FOR UPDATE``
makes the second guard wait for the first transaction to end and then read the mark it
committed. Under REPEATABLE READ or SERIALIZABLE a guard that waited for a transaction which
raised the mark gets ``psycopg.errors.SerializationFailure`` instead: nothing is written, retry.

    guard = PostgresGuard(conn, ProofVerifier.from_files("cluster.pub"))
    guard.ensure_schema()
    with guard.fenced("orders/7", proof) as cur:   # StaleToken / InvalidProof before the body
        cur.execute("UPDATE orders SET total = %s WHERE id = 7", (42,))
    # committed here, together with the hwm; any exception in the body rolls both back

Tokens are uint64 and ``bigint`` is signed, so the hwm is ``numeric(20,0)``. Durability is the
server's (``fsync``, ``synchronous_commit``); the guard changes no setting. A guard waits for
another holder's transaction as long as the connection's ``lock_timeout`` allows (none by
default): set one if a holder may stall inside its fenced body.
"""

from __future__ import annotations

import functools
from decimal import Decimal

from coordinator.client.exceptions import StaleToken
from coordinator.client.guard_rule import Guard
from coordinator.core.limits import TOKEN_MAX

try:
    import psycopg
    from psycopg import sql
    from psycopg.pq import TransactionStatus
    from psycopg.rows import tuple_row
except ImportError as exc:  # an optional extra: say which, not just the module's name
    raise ImportError(
        f"PostgresGuard needs psycopg 3 ({exc}): pip install 'fencing-coordinator[postgres]'"
    ) from exc

# StaleToken is the client's own: one ``except StaleToken`` catches every fence's refusal.
__all__ = ["PostgresGuard", "StaleToken"]

# Each statement with {} for the quoted table name.
_STATEMENTS = {
    "create_table": "CREATE TABLE IF NOT EXISTS {} (resource text PRIMARY KEY,"
    f" hwm numeric(20,0) NOT NULL CHECK (hwm BETWEEN 1 AND {TOKEN_MAX}))",
    "read": "SELECT hwm FROM {} WHERE resource = %s",
    # FOR UPDATE: the row stays locked to this transaction's end (see the module's docstring).
    "lock": "SELECT hwm FROM {} WHERE resource = %s FOR UPDATE",
    # DO NOTHING, not an error: a concurrent first writer's insert makes this one wait for that
    # transaction, and if it committed, the rule reads its mark (locked) instead.
    "create": "INSERT INTO {} (resource, hwm) VALUES (%s, %s) ON CONFLICT (resource) DO NOTHING",
    "raise": "UPDATE {} SET hwm = %s WHERE resource = %s",
}


def _decode(value: object, resource: str) -> int:
    if not (isinstance(value, Decimal) and value == value.to_integral_value() and 1 <= value <= TOKEN_MAX):
        raise ValueError(f"hwm of {resource!r} is {value!r}, not a token in 1..2**64-1: table damaged?")
    return int(value)


class PostgresGuard(Guard):
    """Fences writes to a PostgreSQL database: one hwm per resource in ``table``.

    ``verifier``: see ``Guard`` (None: trusted int tokens, no proofs). ``table`` is found
    through the connection's ``search_path``.

    The connection may be in autocommit mode or not, with no transaction open when ``fenced``
    is called (status IDLE): the guard opens its own, and ``hwm()`` and ``ensure_schema()``
    commit at once (inside a caller's transaction they run in a savepoint of it).
    """

    _connection_type = psycopg.Connection
    _connection_name = "psycopg.Connection"
    _conn: psycopg.Connection

    @functools.cached_property
    def _sql(self) -> dict[str, sql.Composed]:
        name = sql.Identifier(self._table_name)  # quoted, so a keyword such as "order" is a name too
        return {key: sql.SQL(text).format(name) for key, text in _STATEMENTS.items()}

    def ensure_schema(self) -> None:
        """Create the hwm table if it does not exist. Two processes creating it at the same moment
        can fail with a unique violation on PostgreSQL's catalog: create it once, at deployment."""
        with self._conn.transaction():
            self._conn.execute(self._sql["create_table"])

    # -- the storage adapter -----------------------------------------------------------------

    def _in_transaction(self) -> bool:
        # INERROR (a failed statement, not yet rolled back) and ACTIVE count as open too.
        return self._conn.info.transaction_status != TransactionStatus.IDLE

    def _begin(self) -> None:
        # Without autocommit psycopg opens the transaction with the next statement by itself;
        # an explicit BEGIN there would only earn the server's "already in progress" warning.
        if self._conn.autocommit:
            self._conn.execute("BEGIN")

    def _read_hwm(self, resource: str) -> int | None:
        with self._conn.transaction():  # ends here, so a plain read leaves no transaction open
            return self._one_hwm(self._sql["read"], resource)

    def _lock_hwm(self, resource: str) -> int | None:
        return self._one_hwm(self._sql["lock"], resource)

    def _one_hwm(self, query: sql.Composed, resource: str) -> int | None:
        # Our own row factory: the caller's (dict_row, a class) stays the connection's.
        with self._conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(query, (resource,)).fetchone()
        return None if row is None else _decode(row[0], resource)

    def _create_hwm(self, resource: str, token: int) -> bool:
        return self._conn.execute(self._sql["create"], (resource, Decimal(token))).rowcount == 1

    def _raise_hwm(self, resource: str, token: int) -> None:
        self._conn.execute(self._sql["raise"], (Decimal(token), resource))

    def _cursor(self) -> psycopg.Cursor:
        return self._conn.cursor()

    def _commit(self) -> None:
        self._conn.commit()  # by transaction status, so it also ends the explicit BEGIN of autocommit mode

    def _rollback(self) -> None:
        self._conn.rollback()
