"""The server layer: ``fencingd`` and its gRPC servicers.

Owns: configuration (``config``), authentication and authorization (``auth``), the servicers
(``service``: validate, propose with a deadline, map the outcome through one table), the
one status table (``errors``), metrics (``metrics``), CPU placement (``cpu_pin``), the
process that wires them (``app``) and the ``fencingd`` command.
Must never: touch the Raft library (only ``coordinator.raft`` does), decide a fencing outcome
(the state machine does), or map an error to a gRPC status anywhere but ``errors``.
"""
