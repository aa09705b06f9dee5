"""The core layer: the pure, deterministic fencing state machine.

Owns: limits (``limits``), field validation with one field table per RPC (``validation``),
the API's error vocabulary (``names``: ErrorInfo reasons, metadata keys, trailer names), the
numbered command codec (``commands``) and each op's body fields (``bodies``); the state
machine that applies commands (``state_machine``: decoding, dedup and dispatch), with its
handlers by family -- leases, expiry and the lock queue (``lease_handlers``), fenced writes
and reads (``write_handlers``), force-release, the epoch floor and restore
(``admin_handlers``) -- on the state and rules they share (``machine_base``), and the packing
of its snapshots (``snapshot_pack``); the state it keeps (``state``), what it answers
(``outcomes``), the checked reading of its snapshots (``snapshot_format``), and the pieces
it delegates to: the dedup table (``dedup``), the expiry indexes (``expiry``), the lock
queue's bookkeeping (``lock_queue``) and the staging of a chunked restore
(``restore_staging``).
Must never: import anything that does I/O or reads a clock or randomness (sockets, files,
threads, ``time``, ``random``, gRPC, the Raft library), or any other ``coordinator`` layer. Time
arrives inside each command; every replica applying the same log reaches the same state.
``tests/test_layers.py`` enforces this.
"""
