"""The client layer: what a service embeds to take leases and make fenced writes.

Owns: ``FencingClient`` and ``Lease`` (``sync``), ``AsyncFencingClient`` and ``AsyncLease``
(``aio``), both on one base (``_base``: configuration and endpoint choice) built from private
parts -- every RPC method (``_methods``), one call's attempts (``_calls``), a lock wait
(``_lock_wait``), a held lease and its keep-alive policy (``_lease``), request checks
(``_requests``) and the defaults (``_defaults``) -- with one retry policy (``retry``) and
the multiplexed batch path (``multiplex``); leader election on the lock queue
(``election``); the result dataclasses (``results``); the exception tree (``exceptions``);
token proofs (``proof``) and external guards (the rule in ``guard_rule``; SQLite in
``guard``, PostgreSQL in ``pg_guard``, MySQL in ``mysql_guard``, Redis in ``redis_guard``,
each but SQLite behind its extra); and the ``fencingctl`` command (``fencingctl``, its
``lock`` subcommand in ``lockcmd`` and ``lock_child``, duration words in ``durations``, PEM
files in ``pemfile``, the installed version in ``version``).
Must never: import ``coordinator.raft`` or ``coordinator.server`` (a client runs without
them), or report an outcome it does not know: after an attempt that may have applied it
says OutcomeUnknown.

The public surface is re-exported here: ``from coordinator.client import FencingClient``.
"""

# sync.py's __all__ is the one list of public names (it re-exports the asyncio client and
# the results too), so this module cannot drift from it.
from coordinator.client.sync import *  # noqa: F401,F403
from coordinator.client.sync import __all__  # noqa: F401
