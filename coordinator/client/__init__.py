"""The client layer: what a service embeds to take leases and make fenced writes.

Owns: ``FencingClient`` and ``Lease`` (``sync``), ``AsyncFencingClient`` and ``AsyncLease``
(``aio``), both on one base (``_base``) with one retry policy (``retry``); the result
dataclasses (``results``); the exception tree (``exceptions``); token proofs (``proof``) and
external guards (the rule in ``guard_rule``; SQLite in ``guard``, PostgreSQL in ``pg_guard``,
which needs the ``[postgres]`` extra); and the ``fencingctl`` command.
Must never: import ``coordinator.raft`` or ``coordinator.server`` (a client runs without
them), or report an outcome it does not know: after an attempt that may have applied it
says OutcomeUnknown.

The public surface is re-exported here: ``from coordinator.client import FencingClient``.
"""

# sync.py's __all__ is the one list of public names (it re-exports the asyncio client and
# the results too), so this module cannot drift from it.
from coordinator.client.sync import *  # noqa: F401,F403
from coordinator.client.sync import __all__  # noqa: F401
