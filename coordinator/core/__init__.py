"""The core layer: the pure, deterministic fencing state machine.

Owns: the rules of DESIGN §3 applied one log entry at a time, the state they keep, the
commands that carry them, and every field rule and limit, shared with the server and the
client so all three refuse the same inputs.
Must never: import anything that does I/O or reads a clock or randomness (sockets, files,
threads, ``time``, ``random``, gRPC, the Raft library), or any other ``coordinator`` layer. Time
arrives inside each command; every replica applying the same log reaches the same state.
``tests/test_layers.py`` enforces this.

Modules (one job each; ``tests/test_layers.py`` checks this map against the files):

    state_machine    ``FencingStateMachine``: decodes and applies each command, the rules
                     of every op, refusals as values, the canonical snapshot
    commands         the numbered op codes, the versioned msgpack command envelope, its
                     bounded decoder and one constructor per op
    validation       one check per field name, and which fields each RPC's request carries
    outcomes         what applying answers: ``Applied`` / ``Rejected`` with a ``Reason``, and
                     their wire form
    state            the state as data: resources, leases, usage per principal, dedup entries
    dedup            the dedup table of op_ids, accounted and evicted per principal (I5)
    expiry           ``ExpiryIndex``: which leases a TICK expires, found without a scan
    lock_queue       ``LockQueue``: each resource's FIFO lock waiters
    restore_staging  ``RestoreStaging``: the backup being restored in chunks (I11)
    snapshot_format  reading a snapshot, every field checked before it becomes state
    names            the API's error vocabulary: ErrorInfo reasons, metadata keys, trailers
    limits           every limit of the API and the state, unit last, each with its reason
"""
