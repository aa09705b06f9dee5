"""The MySQL/MariaDB guard: the fencing rule (I3) enforced at an InnoDB table (PyMySQL).

Owns: how ``MySQLGuard`` keeps the rule of ``guard_rule.Guard`` in a ``pymysql`` connection:
a durable high-water mark (hwm) per resource in an InnoDB table of the caller's own database,
locked with ``INSERT ... ON DUPLICATE KEY UPDATE`` (which creates the first mark) and read
with ``SELECT ... FOR UPDATE``, in the same transaction as the caller's statements.
Must never: accept a write whose token is below the resource's hwm, let the hwm and the
mutation commit separately, trust a token without a proof when it has a verifier, or change
the caller's session settings (autocommit, isolation level).

Why the row lock and why the insert comes first: InnoDB's plain ``SELECT`` is a consistent
read that takes no lock, so another holder could raise the mark between this one's check and
its commit. The insert-or-lock makes a second guard wait for the first transaction and then
read, with ``FOR UPDATE``, the mark it committed: a locking read sees the newest committed row
under READ COMMITTED and REPEATABLE READ alike. Taking the row by insert rather than by
``SELECT ... FOR UPDATE`` on a missing row avoids REPEATABLE READ's gap locks, which would
deadlock two first writers of one resource. No consistent read happens before the lock, so
under REPEATABLE READ the body's own reads see what the previous holder committed.

    guard = MySQLGuard(conn, ProofVerifier.from_files("cluster.pub"))
    guard.ensure_schema()
    with guard.fenced("orders/7", proof) as cur:   # StaleToken / InvalidProof before the body
        cur.execute("UPDATE orders SET total = %s WHERE id = 7", (42,))
    # committed here, together with the hwm; any exception in the body rolls both back

Tokens are uint64 and ``BIGINT`` is signed, so the hwm is ``DECIMAL(20,0)``; the resource is
``VARBINARY``, compared byte for byte (a case-insensitive collation would merge "A" and "a").
The table must be InnoDB (MyISAM has no transactions: ``ensure_schema`` makes it InnoDB).
Durability is the server's (``innodb_flush_log_at_trx_commit=1``, ``sync_binlog=1``). A guard
waits for another holder's transaction for ``innodb_lock_wait_timeout`` (50 s by default), then
fails with error 1205, nothing written.
"""

from __future__ import annotations

from decimal import Decimal

from coordinator.client.exceptions import StaleToken
from coordinator.client.guard_rule import Guard
from coordinator.core.limits import RESOURCE_NAME_BYTES_MAX, TOKEN_MAX

try:
    import pymysql
    from pymysql.constants import SERVER_STATUS
    from pymysql.cursors import Cursor
except ImportError as exc:  # an optional extra: say which, not just the module's name
    raise ImportError(f"MySQLGuard needs PyMySQL ({exc}): pip install 'fencing-coordinator[mysql]'") from exc

__all__ = ["MySQLGuard", "StaleToken"]

# Each statement with {} for the quoted table name.
_STATEMENTS = {
    "create_table": "CREATE TABLE IF NOT EXISTS {} ("
    f" resource VARBINARY({RESOURCE_NAME_BYTES_MAX}) NOT NULL PRIMARY KEY,"
    f" hwm DECIMAL(20,0) NOT NULL CHECK (hwm BETWEEN 1 AND {TOKEN_MAX})) ENGINE=InnoDB",
    "read": "SELECT hwm FROM {} WHERE resource = %s",
    # FOR UPDATE: the newest committed row, locked to this transaction's end (module docstring).
    "lock": "SELECT hwm FROM {} WHERE resource = %s FOR UPDATE",
    # The first write's mark; on an existing row an exclusive lock and no change.
    "create": "INSERT INTO {} (resource, hwm) VALUES (%s, %s) ON DUPLICATE KEY UPDATE hwm = hwm",
    "raise": "UPDATE {} SET hwm = %s WHERE resource = %s",
}


def _decode(value: object, resource: str) -> int:
    if not (isinstance(value, Decimal) and value == value.to_integral_value() and 1 <= value <= TOKEN_MAX):
        raise ValueError(f"hwm of {resource!r} is {value!r}, not a token in 1..2**64-1: table damaged?")
    return int(value)


class MySQLGuard(Guard):
    """Fences writes to a MySQL or MariaDB database: one hwm per resource in ``table``.

    ``verifier``: see ``Guard`` (None: trusted int tokens, no proofs).

    The connection may be in autocommit mode or not (PyMySQL's default), with no transaction
    open when ``fenced`` is called: the guard opens its own, and ``hwm()`` reads in a
    transaction of its own (inside a caller's open transaction: in that one, as it sees it).
    """

    _connection_type = pymysql.connections.Connection
    _connection_name = "pymysql.connections.Connection"
    _conn: pymysql.connections.Connection

    def _sql(self, key: str) -> str:
        return _STATEMENTS[key].format(f"`{self._table_name}`")  # quoted: a keyword such as order is a name too

    def ensure_schema(self) -> None:
        """Create the hwm table if it does not exist. DDL commits implicitly in MySQL, so it is
        refused inside an open transaction rather than committing the caller's work."""
        if self._in_transaction():
            raise RuntimeError("ensure_schema() in an open transaction would commit it (MySQL DDL): commit first")
        with self._conn.cursor() as cur:
            cur.execute(self._sql("create_table"))

    # -- the storage adapter -----------------------------------------------------------------

    def _in_transaction(self) -> bool:
        # The server reports it in every reply: an implicit transaction of a non-autocommit
        # session (opened by any statement) counts too.
        # types-PyMySQL leaves out Connection.server_status, which PyMySQL sets from every reply.
        return bool(self._conn.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS)  # type: ignore[attr-defined]

    def _begin(self) -> None:
        self._conn.begin()

    def _admit(self, resource: str, token: int) -> None:
        # The row first, by insert-or-lock (module docstring); then the rule reads it locked.
        self._create_hwm(resource, token)
        super()._admit(resource, token)

    def _read_hwm(self, resource: str) -> int | None:
        if self._in_transaction():
            return self._one_hwm("read", resource)
        self._conn.begin()
        try:
            return self._one_hwm("read", resource)
        finally:
            self._conn.commit()  # ends the read, so the connection is left as it was

    def _lock_hwm(self, resource: str) -> int | None:
        return self._one_hwm("lock", resource)

    def _one_hwm(self, key: str, resource: str) -> int | None:
        with self._conn.cursor(Cursor) as cur:  # a tuple cursor, whatever the connection's class
            cur.execute(self._sql(key), (resource.encode(),))
            row = cur.fetchone()
        return None if row is None else _decode(row[0], resource)

    def _create_hwm(self, resource: str, token: int) -> bool:
        with self._conn.cursor(Cursor) as cur:
            cur.execute(self._sql("create"), (resource.encode(), Decimal(token)))
        # Whether it inserted or found a row, the row is ours now: the rule reads it again.
        return False

    def _raise_hwm(self, resource: str, token: int) -> None:
        with self._conn.cursor(Cursor) as cur:
            cur.execute(self._sql("raise"), (Decimal(token), resource.encode()))

    def _cursor(self) -> Cursor:
        return self._conn.cursor()

    def _commit(self) -> None:
        self._conn.commit()

    def _rollback(self) -> None:
        self._conn.rollback()
