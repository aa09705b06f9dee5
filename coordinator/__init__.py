"""The fencing coordinator: leases with fencing tokens, enforced at the resource.

One folder per layer; imports point only downward (``tests/test_layers.py`` checks it)::

    server ──> raft ──> core
       │                 ^
       └────> client ────┘      (and every layer may use the generated ``api``)

- ``core``: the pure state machine, commands, validation, limits;
- ``raft``: the only code that touches the Raft library; the durable, hardened Raft node;
- ``client``: the sync and asyncio clients, exceptions, token proofs, guards, ``fencingctl``;
- ``server``: ``fencingd``, the gRPC servicers, auth, the status table, metrics, config;
- ``api``: a copy of the wire contract (``proto/``'s ``fencing.proto``) and the code generated from it.

Test and benchmark supervisors live in ``testsupport/`` beside this package and are not
part of the installed wheel.
"""
