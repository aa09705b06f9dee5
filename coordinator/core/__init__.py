"""The core layer: the pure, deterministic fencing state machine.

Owns: the rules of DESIGN §3 applied one log entry at a time, the state they keep, the
commands that carry them, and every field rule and limit, shared with the server and the
client so all three refuse the same inputs.
Must never: import anything that does I/O or reads a clock or randomness (sockets, files,
threads, ``time``, ``random``, gRPC, the Raft library), or any other ``coordinator`` layer. Time
arrives inside each command; every replica applying the same log reaches the same state.
``tests/test_layers.py`` enforces this.

Modules (one job each; ``tests/test_layers.py`` checks this map against the files):

    state_machine    ``FencingStateMachine``: decodes each entry into its typed body, answers
                     a retried op_id, dispatches to its family's handler, keeps the log clock
    ops              one typed body per op, its fields' rules declared once: built by the
                     server, encoded by the proposer, decoded and checked by every replica
    requests         each RPC's request fields, taken from the op bodies (and the few RPC-
                     only ones), checked alike by the client and the server
    machine_base     the state every handler family shares, and the rules on more than one
                     path: fencing a token, granting a lease, quotas
    lease_handlers   ACQUIRE, KEEP_ALIVE, RELEASE, TICK (expiry) and the lock queue's
                     ENQUEUE, DEQUEUE
    write_handlers   the fenced WRITE and DELETE, READ_BARRIER, and the limits a write meets
    listing          one page of resources by name under some prefixes (a listing
                     READ_BARRIER, Lease.List), and the prefixes a caller's grants allow
    name_index       ``SortedNames``: the resource names in order, for a page without a scan
    admin_handlers   FORCE_RELEASE, SET_EPOCH_FLOOR, the chunked restore and the state swap
    snapshot_pack    the canonical snapshot, whole or in bounded pieces
    commands         the numbered op codes, the entry levels, the versioned msgpack command
                     envelope, its bounded decoder, and unchecked commands for tests and tools
    validation       one check per field name (charset, length, range)
    outcomes         what applying answers: ``Applied`` / ``Rejected`` with a ``Reason``, and
                     their wire form
    results          one frozen result type per op (``WriteResult``, ``LockState`` ...), each
                     with the exact map the dedup table and snapshots store, read back checked
    changes          what an applied entry changed, as Watch reports it (``Change``)
    state            the state as data: resources, leases, usage per principal, dedup entries
    dedup            the dedup table of op_ids, accounted and evicted per principal (I5)
    expiry           ``ExpiryIndex``: which leases a TICK expires, found without a scan
    lock_queue       ``LockQueue``: each resource's FIFO lock waiters
    restore_staging  ``RestoreStaging``: the backup being restored in chunks (I11)
    snapshot_format  reading a snapshot, every field checked before it becomes state
    names            the API's error vocabulary: ErrorInfo reasons, metadata keys, trailers
    limits           every limit of the API and the state, unit last, each with its reason
"""
