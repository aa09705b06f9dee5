"""The server layer: ``fencingd`` and its gRPC servicers.

Owns: one member's process: its configuration, who may call, the servicers of ``fencing.v1``
(validate, propose with a deadline, map the outcome through one table), Admin and its audit
log, backups, metrics, and the admission of connections and streams.
Must never: touch the Raft library (only ``coordinator.raft`` does), decide a fencing outcome
(the state machine does), or map an error to a gRPC status anywhere but ``errors``.

Modules (one job each; ``tests/test_layers.py`` checks this map against the files):

    fencingd          the ``fencingd`` command: ``serve``, ``dev``, ``health``, ``keygen``,
                      ``gen-secret``, ``check-config``, ``restore-cluster``
    health_probe      ``fencingd health``: one health check, grpc_health_probe's exit codes
    restore_cluster   ``fencingd restore-cluster``: a new cluster's data dirs made offline
                      from a backup, fenced above every old token (disaster recovery)
    app               one ``fencingd serve`` process: the Raft node, the gRPC server, wiring
    service           the Lease, FencedStore and Cluster servicers: pb in, pb out, nothing more
    admin             the Admin servicer: its authorization and its audit log
    request_core      what every servicer shares: request checks, the caller's authorization
                      and quota charge, one proposal or read barrier, headers, error trailers
    lock_wait         the Acquire that waits in line and the Lock call's wait for its grant
    batches           the *Many RPCs' fan-out (each item as the call alone) and their limits
    proposer          every proposal: stamp, in-flight bound, deadline, fate to ServiceError
    stream_slots      open KeepAliveStreams per principal, against its ``streams_max`` quota
    watch_hub         Watch's feed: each applied entry's changes in a bounded history, and
                      the watchers reading it, capped per caller
    watch_service     the Watch servicer: a prefix's changes streamed from the hub, resumable
    errors            every failure the API reports, and the one table to gRPC statuses
    backups           snapshots handed out and restores proposed in chunks
    members           the members as the API shows them; membership changes' checks
    lease_ticker      ``LeaseTicker``: the leader's TICK every ``lease_tick_interval_s``
    level_poller      rolling upgrades: this build's entry levels announced, the leader's SET_CLUSTER_LEVEL
    auth              the principals file, bearer tokens, resource prefixes, admin checks
    config            a ``ServerConfig`` built from the TOML file and flags
    settings          ``ServerConfig``: every setting, its default and unit, what follows
                      from it, and the files it names, read
    config_checks     ``validate``: whether a ``ServerConfig`` is usable, in one fixed order
    tomlfile          reading one TOML file with errors that name it
    certs             the API's TLS files, read and checked at start and on SIGHUP
    listen_check      why an address cannot be listened on, asked of the OS
    member_dir        whether ``data_dir`` is this member's (its identity file), before start
    api_conns         connection limits of the gRPC API, and descriptors kept for the rest
    streams           admission of calls that hold a worker thread long; stream idle timeout
    stream_admission  the interceptor that admits every streaming RPC, any service's
    log_limits        what a caller can make a member write to its logs, bounded
    metrics           Prometheus metrics of one member
    metrics_http      the metrics endpoint's HTTP server (``/metrics``, ``/readyz``)
    cpu_pin           ``cpu_affinity``: the leader's threads on one CPU
    sd_notify         systemd's readiness protocol: READY=1, STOPPING=1, STATUS= to $NOTIFY_SOCKET
    server_extra      whether the ``[server]`` extra is installed, said in one line
"""
