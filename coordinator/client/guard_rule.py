"""The fencing rule every guard applies (I3 at an external store), whatever the database.

Owns: what a guard accepts as a token (one its ``ProofVerifier`` shows the coordinator issued
for that resource, or with no verifier a trusted int), the rule per resource (token < hwm is
refused with ``StaleToken``; token == hwm is accepted, one holder writes many times in its
epoch; token > hwm is accepted and raises hwm to it), and the shape of one fenced
transaction: refuse a connection with a transaction already open, begin, read the hwm and
hold it until the end, apply the rule, run the caller's body, commit both as one or roll
both back. ``Guard`` is that shape; a storage adapter (``guard.SqliteGuard``,
``pg_guard.PostgresGuard``, ``mysql_guard.MySQLGuard``) fills in how its database begins,
locks, reads and writes. A store with no transactions to hold a lock in (Redis:
``redis_guard.RedisGuard``) applies the same rule in one server-side step instead, and shares
the argument checks here (``check_resource``, ``token_of``).
Must never: hold a database's SQL or driver (the adapters do), run the body after a refusal,
or let the hwm and the body's mutation commit separately.
"""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Iterator
from typing import Any, ClassVar

from coordinator.client.exceptions import StaleToken
from coordinator.client.proof import ProofVerifier
from coordinator.core import validation
from coordinator.core.limits import TOKEN_MAX

__all__ = ["Guard", "check_resource", "check_table_name", "check_verifier", "token_of"]

# An unquoted SQL name of at most 63 characters (PostgreSQL's NAMEDATALEN - 1; SQLite has
# no limit, one rule keeps a table name portable between the two). Adapters quote it anyway,
# so a keyword such as "order" is a name too.
_TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}", re.ASCII)


def check_table_name(table: object) -> str:
    """``table`` if it is a plain SQL name, else ValueError (it goes into SQL text)."""
    if not isinstance(table, str) or _TABLE_RE.fullmatch(table) is None:
        raise ValueError(f"table name {table!r} must match [A-Za-z_][A-Za-z0-9_]* (at most 63 characters)")
    return table


def check_verifier(verifier: object) -> None:
    """TypeError unless ``verifier`` is a ProofVerifier or None (None: trusted int tokens)."""
    if verifier is not None and not isinstance(verifier, ProofVerifier):
        raise TypeError(f"verifier must be a ProofVerifier or None, not {type(verifier).__name__}")


def check_resource(resource: object) -> None:
    """TypeError / ValueError unless ``resource`` is a name the coordinator issues tokens for."""
    if not isinstance(resource, str):
        raise TypeError(f"resource must be a str, not {type(resource).__name__}")
    try:
        validation.check_resource(resource)  # the coordinator issues tokens for no other name
    except validation.InvalidField as exc:
        raise ValueError(str(exc)) from None


def token_of(verifier: ProofVerifier | None, resource: str, proof: object) -> int:
    """The token ``proof`` carries for ``resource`` (InvalidProof if the verifier refuses it);
    with no verifier ``proof`` is the token itself, an int in 1..2**64-1."""
    if verifier is not None:
        if not isinstance(proof, (bytes, bytearray, str)):
            raise TypeError(
                f"this guard checks signed proofs: pass the proof as bytes or text, not {type(proof).__name__}"
            )
        return verifier.verify(bytes(proof) if isinstance(proof, bytearray) else proof, resource=resource).token
    if not validation.is_int(proof):
        raise TypeError(f"a guard without a verifier takes the token as an int, not {type(proof).__name__}")
    if not 0 < proof <= TOKEN_MAX:
        raise ValueError(f"token {proof} is outside 1..2**64-1")
    return int(proof)


class Guard(abc.ABC):
    """Fences writes to one database connection: one durable hwm per resource in ``table``.

    ``verifier`` checks each token's proof. With ``verifier=None`` the guard takes plain
    int tokens and believes them: only for trusted callers, because one made-up huge token
    (``2**64-1``) then locks every real holder out of that resource for good.
    """

    # The adapter's connection class, and its name as a user imports it (for the TypeError).
    _connection_type: ClassVar[type]
    _connection_name: ClassVar[str]
    # Table names the database keeps for itself (SQLite: "sqlite_"), if any.
    _reserved_table_prefix: ClassVar[str | None] = None

    def __init__(self, connection: Any, verifier: ProofVerifier | None, *, table: str = "fencing_hwm") -> None:
        if not isinstance(connection, self._connection_type):
            raise TypeError(f"connection must be a {self._connection_name}, not {type(connection).__name__}")
        check_verifier(verifier)
        prefix = self._reserved_table_prefix
        if check_table_name(table) and prefix is not None and table.lower().startswith(prefix):
            raise ValueError(f"table name {table!r}: names starting with {prefix!r} are reserved by the database")
        self._conn = connection
        self._verifier = verifier
        self._table_name = table  # the hwm table, a plain SQL name: adapters quote it

    # -- what every guard offers -------------------------------------------------------------

    def hwm(self, resource: str) -> int | None:
        """The highest token accepted for ``resource``, or None if it has never been written."""
        self._check_resource(resource)
        return self._read_hwm(resource)

    @contextlib.contextmanager
    def fenced(self, resource: str, proof: bytes | str | int) -> Iterator[Any]:
        """One fenced transaction: refuse or accept the token, then the body's mutation.

        Raises InvalidProof (from the verifier) or StaleToken before the body runs, with
        nothing changed. Otherwise the hwm is raised if the token is higher, the body gets a
        cursor in the same transaction, which holds the hwm locked from its read to the
        commit (so another holder cannot slip in between), and the whole is committed on
        normal exit or rolled back on any exception.
        """
        self._check_resource(resource)
        token = self._token(resource, proof)
        if self._in_transaction():
            raise RuntimeError(
                "the connection is already in a transaction: commit or roll back first, "
                "the guard's check and the mutation must be one transaction of their own"
            )
        self._begin()
        try:
            self._admit(resource, token)
            yield self._cursor()
            if not self._in_transaction():
                raise RuntimeError(
                    "the fenced body ended the guard's transaction itself (commit/rollback): "
                    "leave that to the guard, so the mutation and the hwm commit as one"
                )
            self._commit()
        except BaseException:  # any exit of the body, interrupts too, rolls back; re-raised
            # The database may already have rolled back on some errors (SQLite on a full disk).
            if self._in_transaction():
                self._rollback()
            raise

    # -- the rule ------------------------------------------------------------------------------

    def _admit(self, resource: str, token: int) -> None:
        """Inside the open transaction: StaleToken, or the hwm raised to ``token`` (held locked)."""
        hwm = self._lock_hwm(resource)
        if hwm is None:
            if self._create_hwm(resource, token):
                return  # the resource's first token
            # Another transaction created the mark between our read and our insert and has
            # committed it: read it again, now locked, and judge the token against it.
            hwm = self._lock_hwm(resource)
            if hwm is None:
                raise RuntimeError(f"the hwm row of {resource!r} was deleted while a guard was taking it")
        if token < hwm:
            raise StaleToken.at_guard(resource, token, hwm)
        if token > hwm:
            self._raise_hwm(resource, token)

    def _check_resource(self, resource: object) -> None:
        check_resource(resource)

    def _token(self, resource: str, proof: object) -> int:
        return token_of(self._verifier, resource, proof)

    # -- what a storage adapter provides -------------------------------------------------------

    @abc.abstractmethod
    def _in_transaction(self) -> bool:
        """Whether the connection has a transaction open (also a failed one not yet rolled back)."""

    @abc.abstractmethod
    def _begin(self) -> None:
        """Open the guard's transaction."""

    @abc.abstractmethod
    def _read_hwm(self, resource: str) -> int | None:
        """The committed hwm, outside a fenced transaction (``hwm()``)."""

    @abc.abstractmethod
    def _lock_hwm(self, resource: str) -> int | None:
        """The hwm, locked against every other guard until this transaction ends; None if no row."""

    @abc.abstractmethod
    def _create_hwm(self, resource: str, token: int) -> bool:
        """Insert the first hwm; False if another transaction's committed row was there first."""

    @abc.abstractmethod
    def _raise_hwm(self, resource: str, token: int) -> None:
        """Set the locked row's hwm to ``token``."""

    @abc.abstractmethod
    def _cursor(self) -> Any:
        """A cursor in the guard's transaction, for the body."""

    @abc.abstractmethod
    def _commit(self) -> None: ...

    @abc.abstractmethod
    def _rollback(self) -> None: ...
