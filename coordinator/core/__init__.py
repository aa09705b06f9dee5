"""The core layer: the pure, deterministic fencing state machine.

Owns: limits (``limits``), field validation with one field table per RPC (``validation``),
the API's error vocabulary (``names``: ErrorInfo reasons, metadata keys, trailer names), the
numbered command codec (``commands``), the state machine that applies commands
(``state_machine``), the state it keeps (``state``), what it answers (``outcomes``), the
checked reading of its snapshots (``snapshot_format``), and the pieces it delegates to: the
expiry indexes (``expiry``), the lock queue's bookkeeping (``lock_queue``) and the staging of
a chunked restore (``restore_staging``).
Must never: import anything that does I/O or reads a clock or randomness (sockets, files,
threads, ``time``, ``random``, gRPC, the Raft library), or any other ``coordinator`` layer. Time
arrives inside each command; every replica applying the same log reaches the same state.
``tests/test_layers.py`` enforces this.
"""
