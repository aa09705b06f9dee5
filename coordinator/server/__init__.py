"""The server layer: ``fencingd`` and its gRPC servicers.

Owns: configuration (``config``), authentication and authorization (``auth``), the one status
table (``errors``), metrics (``metrics``), CPU placement (``cpu_pin``), the process that wires
them (``app``) and the ``fencingd`` command. An RPC crosses, in order:

- ``service``: the Lease, FencedStore and Cluster servicers, pb in and pb out, nothing more;
- ``admin``: the Admin servicer, its authorization and its audit log;
- ``request_core``: request field checks, the caller's authorization and quota charge, one
  proposal or read barrier with the RPC's deadline, response headers and error trailers;
- ``lock_wait``: the Acquire that waits in line and the Lock call's wait for its grant;
- ``batches``: the *Many RPCs' fan-out (each item as the call alone) and their limits;
- ``proposer``: stamping, in-flight bounds, deadlines and fates of every proposal;
- ``stream_slots``: open KeepAliveStreams per principal against its quota.

Must never: touch the Raft library (only ``coordinator.raft`` does), decide a fencing outcome
(the state machine does), or map an error to a gRPC status anywhere but ``errors``.
"""
