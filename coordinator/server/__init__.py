"""The server layer: ``fencingd`` and its gRPC servicers.

Owns the process in front of one Raft node: its command, its configuration, its gRPC API and
what guards it. Must never: touch the Raft library (only ``coordinator.raft`` does), decide a
fencing outcome (the state machine does), or map an error to a gRPC status anywhere but
``errors``.

The modules, in the order an RPC crosses them:

- ``service``: the Lease, FencedStore and Cluster servicers, pb in and pb out, nothing more;
- ``admin``: the Admin servicer, its authorization and its audit log;
- ``members``: the members as the API shows them, and Admin's membership changes;
- ``backups``: snapshots handed out in chunks, restores read and proposed in chunks;
- ``request_core``: request field checks, the caller's authorization and quota charge, one
  proposal or read barrier with the RPC's deadline, response headers and error trailers;
- ``lock_wait``: the Acquire that waits in line and the Lock call's wait for its grant;
- ``batches``: the *Many RPCs' fan-out (each item as the call alone) and their limits;
- ``proposer``: stamping, in-flight bounds, deadlines and fates of every proposal;
- ``errors``: every failure the API reports, and the one table mapping it to a gRPC status;
- ``auth``: who is calling and whether they may touch a resource;
- ``stream_slots``: open KeepAliveStreams per principal against its quota;
- ``streams`` and ``stream_admission``: caps on calls that hold a worker thread for long
  (streams, waiting Acquires and Lock calls) and the idle timeout of streams;
- ``api_conns``: connection limits of the gRPC API;
- ``log_limits``: how much a caller can make a member write to its logs.

Around them, the process:

- ``app``: one ``fencingd serve`` process, the only wiring of the servicers (``add_services``);
- ``fencingd``: the command; ``config`` and ``tomlfile``: its configuration;
- ``lease_ticker``: the leader's lease-clock TICK job;
- ``metrics`` and ``metrics_http``: Prometheus metrics and their HTTP endpoint;
- ``certs``: the API's TLS material; ``listen_check``: why an address cannot be listened on;
- ``cpu_pin``: the leader on one CPU; ``server_extra``: whether the server's dependencies are installed.
"""
