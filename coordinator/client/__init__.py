"""The client layer: what a service embeds to take leases and make fenced writes.

Owns: the sync and asyncio clients on one base with one retry policy, their results and
exceptions, token proofs and guards for external stores, leader election on the lock queue,
and the ``fencingctl`` command.
Must never: import ``coordinator.raft`` or ``coordinator.server`` (a client runs without
them), or report an outcome it does not know: after an attempt that may have applied it
says OutcomeUnknown.

The public surface is re-exported here: ``from coordinator.client import FencingClient``.

Modules (one job each; ``tests/test_layers.py`` checks this map against the files):

    sync         ``FencingClient`` and ``Lease`` (sync, thread-safe); the public names
    aio          ``AsyncFencingClient`` and ``AsyncLease`` (``grpc.aio``)
    _base        what both clients share: configuration and endpoint choice, on ``_methods``
    _methods     every public RPC method, written once: request, retry kind, answer reader
    _calls       one call and its attempts: deadline, attempt count, what is raised
    _lock_wait   one ``lock()`` wait: which Lock call next, pauses, when it ends
    _lease       a held lease, and the keep-alive policy as one pure decision
    session      ``client.session()``: many leases kept alive by one thread, lost together
    aio_session  ``AsyncFencingClient.session()``: the same, renewed by one asyncio task
    _session     a session's renewal schedule and verdicts, as pure decisions
    _requests    request building and the field checks run before anything is sent
    _defaults    every timeout, retry and discovery default, each with its reason
    retry        the retry policy: which failures are retried, the backoff, what to raise
    multiplex    ``multiplex=True``: concurrent calls of one process sent as one batch RPC
    results      the result dataclasses, built from the API's responses
    exceptions   the exception tree, and the public home of every name of the error surface
    rpc_errors   the one table from gRPC errors to the tree, and reading a failed call
    election     ``Election``, ``AsyncElection``: leader election on the lock queue
    watch        ``watch()``: a prefix's changes in log order, resumed across failures
    proof        signed token proofs (DESIGN §6): signing and verifying
    guard_rule   the fencing rule every guard applies at an external store
    guard        the SQLite guard
    pg_guard     the PostgreSQL guard (``[postgres]`` extra)
    mysql_guard  the MySQL/MariaDB guard (``[mysql]`` extra)
    redis_guard  the Redis guard (``[redis]`` extra)
    fencingctl   the ``fencingctl`` command: argv to exit code, one line per error
    ctl_parser   ``fencingctl``'s commands, options and help (argparse)
    ctl_request  what the user typed, checked field by field before anything is sent
    ctl_run      each command's client call and its output, as a table or JSON
    ctl_endpoint  ``fencingctl endpoint status|health``: each endpoint asked on its own
    ctl_watch    ``fencingctl watch`` and ``fencingctl elect``: Watch and elections
    ctl_list     ``fencingctl ls PREFIX``: the resources under a prefix, page by page
    lockcmd      ``fencingctl lock``: run a command while holding a lease
    lock_child   the command ``fencingctl lock`` runs: started, signalled, reaped
    durations    durations as typed on a command line (``10s``, ``500ms``)
    pemfile      reading one PEM file with errors that name it
    version      the installed version, for ``--version`` and the build-info metric
"""

# sync.py's __all__ is the one list of public names (it re-exports the asyncio client and
# the results too), so this module cannot drift from it; the sessions' names are added
# here because session.py builds on sync.py's Lease (sync cannot import it at load time), as
# aio_session.py on aio.py's AsyncLease.
from coordinator.client.aio_session import AsyncSession, AsyncSessionLease
from coordinator.client.session import Session, SessionLease
from coordinator.client.sync import *  # noqa: F403
from coordinator.client.sync import __all__ as _sync_all

__all__ = [*_sync_all, "AsyncSession", "AsyncSessionLease", "Session", "SessionLease"]
