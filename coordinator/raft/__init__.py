"""The Raft layer: the only code that imports pysyncobj.

Owns: replicating a state machine's commands through a hardened pysyncobj 0.3.17, durably
(fsynced on a majority before anything is acknowledged), with typed outcomes. What pysyncobj
does and does not guarantee, and what each module below changes about it and why, is in
``RAFT.md`` beside this file.
Must never: import ``coordinator.server`` or ``coordinator.client``, patch pysyncobj at import
(only ``patches.install()`` does, after the version check), interpret a command (it hands
bytes to a state machine), or acknowledge anything not fsynced on a majority.

Modules (one job each; ``tests/test_layers.py`` checks this map against the files):

    node             ``RaftConfig`` and the ``RaftNode`` facade the server uses: builds the
                     hardened node, ``propose()`` with a typed answer, reads, status,
                     membership calls; pysyncobj's fail codes as ``ProposeFailure``
    interface        what callers see, without pysyncobj: the ``StateMachine`` protocol and
                     ``ProposeOutcome`` / ``ProposeFailure`` / ``ProposeResult``
    patches          the version pin and ``install()``: every patch of pysyncobj's modules
    syncobj          ``HardenedSyncObj``: puts the mixins below together; entry admission,
                     append sanitizing, forwarding to a lost leader; the SyncObjConf; the
                     named fixes
    shared_entries   the mixin that queues commands and packs them into shared entries
    group_commit     the mixin that syncs the journal once per tick, sends once per tick,
                     acks after the sync and caps commit votes at durable copies
    snapshot_install
                     the mixin that loads and installs snapshots keeping the journal tail,
                     compacts by bytes, and holds applies while the writer captures
    durable_term     the mixin that saves term and vote before holding them and stops the
                     member on anything escaping a tick
    member_gate      the mixin that counts votes and acks only from the configuration's
                     incarnations, and bootstraps unanimously
    member_changes   the mixin that decides membership changes on the leader and keeps
                     pysyncobj's node set following the configuration
    read_index       the mixin that answers read-index reads on the leader
    read_rounds      the pure bookkeeping of read-index rounds
    read_lease       the leader's read lease: how long a confirmed round answers reads alone
    pre_vote         the mixin that asks the voters before standing for election
    membership       ``Configuration``, its CONFIG log entry and snapshot form, ``ConfigLog``
    identity         the data dir's identity file: member id, incarnation, cluster id
    replica          ``Replica``: the state machine as pysyncobj's consumer (apply, snapshot
                     hooks, the apply lock)
    journal          ``DurableJournal``: the log and the term and vote on disk, group commit,
                     crash-atomic compaction (prepared ahead by the snapshot writer)
    journal_file     the journal's and ``raft.meta``'s file formats (checksummed records),
                     durable writes, the reaper that frees replaced lists and files
    leader_sync      the leader's background journal sync thread
    snapshot_file    the snapshot file format: written with fsync, verified, read
    snapshot_writer  ``BackgroundSerializer``: snapshots written off the Raft thread
    stamp_clock      ``StampClock``: each command's stamp, the lease clock (DESIGN I6)
    transport        ``BoundTCPTransport``: own addresses, connection admission and naming,
                     the binding handshake driven; ``PeerWarnings``
    connection       what ``patches.install()`` puts on pysyncobj's connections: the bounded
                     frame reader and writer, the answer-owed timeout
    wire             byte formats: typed frames, typed and shared log entries, frame heads
    peer_binding     the three-message handshake that binds a connection to who dialled whom
    peer_keys        ``PeerKeys``: the peer secrets, replaced on SIGHUP without a restart
    addresses        ``Resolver``: members' names looked up again on every connection attempt
    peer_log         ``PeerLog``: one log line per peer connect, loss and quorum transition
    leader_log       ``LeaderLog``: one log line per leader change, and their count
    fatal            exit codes 70/71, which one an exception means, the fatal handler
    limits           the transport's and the log's bounds, each with its reason
"""
