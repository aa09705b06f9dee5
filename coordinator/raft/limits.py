"""The Raft transport's limits: entry batching, peer frames, connection admission.

Owns: numbers tied to how the Raft library (pysyncobj) batches, frames and accepts, each
named with its unit last and with a one-line reason. Must never: import anything but the
standard library and ``coordinator.core.limits`` (the API's limits these are derived from).
"""

from coordinator.core.limits import COMMAND_BYTES_MAX, RESTORE_COMMAND_BYTES_MAX

# Commands proposed at once on one node share one Raft entry (the hardened node batches them): at
# most this many, and this many bytes of commands. Far below the Raft batch size
# (appendEntriesBatchSizeBytes), so a shared entry never takes the split path either.
RAFT_ENTRY_COMMANDS_MAX = 256
RAFT_ENTRY_BYTES_MAX = 1024 * 1024


# One Raft log entry's bytes (pysyncobj's type byte, our entry version byte, then the command):
# the largest a member of ours writes is a restore command alone, or a shared entry (its
# commands, each with a msgpack bin head of at most 5 bytes, and the list's own head). A peer's
# entry or forwarded command over this is refused before anything stores it.
RAFT_LOG_ENTRY_BYTES_MAX = 2 + max(
    RESTORE_COMMAND_BYTES_MAX, 1 + 5 + RAFT_ENTRY_BYTES_MAX + 5 * RAFT_ENTRY_COMMANDS_MAX
)


# -- peer messages -----------------------------------------------------------------
# Terms, log indexes, request ids and commit indexes on the wire: integers in [0, 2^63).
# pysyncobj compares and persists whatever a peer sends; a float term (1e300) once adopted
# could never be passed by an integer one, and the journal stores them as u64.
RAFT_WIRE_INT_END = 2**63
# Snapshot chunks: pysyncobj reads the dump file this many bytes at a time
# (logCompactionBatchSize; syncobj.py sets it to this) and a peer's chunk may be no longer.
RAFT_SNAPSHOT_CHUNK_BYTES = 64 * 1024
# A member's Raft address as it names itself ("host:port"): a DNS name is at most 253
# characters, a port 5 digits; longer is not a member and is refused unread.
RAFT_ADDRESS_CHARS_MAX = 253 + 1 + 5
# What pysyncobj sends in one append: entries up to its batch size (syncobj.py sets it to
# RAFT_BATCH_BYTES) plus the one entry that crosses it, and at most RAFT_APPEND_ENTRIES_MAX
# entries (syncobj.py caps the count; stock pysyncobj has no cap).
RAFT_BATCH_BYTES = max(512 * 1024, 4 * COMMAND_BYTES_MAX, 2 * RESTORE_COMMAND_BYTES_MAX, 2 * RAFT_ENTRY_BYTES_MAX)
RAFT_APPEND_ENTRIES_MAX = 4096
# One typed entry inside an append, beyond its bytes: a 3-item array head (1), the bin head (5)
# and two uint64 (index, term: 9 each). Measured, not guessed: tests/test_raft_peer_input.py.
RAFT_APPEND_ENTRY_OVERHEAD_BYTES = 1 + 5 + 9 + 9
# The largest typed message a member of ours sends, before the secret's encryption: an append
# with pysyncobj's batch just under its size, then one more entry of the largest kind, each with
# its overhead, and the message's own head (version, kind, key, term, indexes: well under 1 KiB).
RAFT_PLAIN_MESSAGE_BYTES_MAX = (
    RAFT_BATCH_BYTES + RAFT_LOG_ENTRY_BYTES_MAX
    + RAFT_APPEND_ENTRY_OVERHEAD_BYTES * RAFT_APPEND_ENTRIES_MAX + 1024
)


def fernet_token_bytes(plain_bytes: int) -> int:
    """Length of pysyncobj's Fernet token (the secret's encryption) of ``plain_bytes``: version,
    timestamp and IV (25 bytes), the ciphertext padded to 16 bytes, the HMAC (32), base64 (4/3)."""
    raw = 1 + 8 + 16 + (plain_bytes // 16 + 1) * 16 + 32
    return 4 * -(-raw // 3)


# One Raft frame after the connection named a member: the largest message a member sends, as the
# secret's encryption stretches it (~16 MiB). A member drops a connection whose next frame
# declares more before its body is waited for, instead of buffering up to the 2 GiB a 32-bit
# length allows (the typed wire has no deflate to inflate past it).
RAFT_MESSAGE_BYTES_MAX = fernet_token_bytes(RAFT_PLAIN_MESSAGE_BYTES_MAX)
# Bytes an incoming connection may hold in its read buffer before it has named a member: its
# messages until then are the binding handshake's hello (956 bytes framed and encrypted for
# the longest addresses and member ids) and its confirm (1,128; both measured in
# tests/test_raft_memory.py); without the secret, the naming message (under 500). 4 KiB is
# several times both, and RAFT_UNNAMED_CONNECTIONS_MAX of them hold 64 KiB at most, where a
# frame each (above) would let strangers park 16 x 16 MiB.
RAFT_PREAUTH_BYTES_MAX = 4 * 1024
# Incoming Raft connections that have not named a member yet. pysyncobj keeps them with no
# deadline and no count, so idle ones from anyone would pile up (each a file descriptor and
# up to a frame of memory). A member names itself in its first message (with the secret, in
# the binding handshake's confirm), within milliseconds: at most this many wait at once, the
# oldest is dropped for a new one, and each is dropped if it names no member in time.
RAFT_UNNAMED_CONNECTIONS_MAX = 16
RAFT_NAMING_DEADLINE_MS = 5_000
# Connections the kernel completes on a Raft port before the member accepts them.
# pysyncobj listens with 5 (tcp_server.py:42): a stranger who kept that full made a member's
# reconnect wait on SYN retransmits (1 s, then 3 s). Accepted, they meet the bounds above.
# (The kernel caps it at net.core.somaxconn, 4096 by default.)
RAFT_LISTEN_BACKLOG = 128
# Per-connection warnings (a refused frame, a dropped connection) are logged at most once per
# this many ms, saying how many were not: anyone who reaches the port makes connections, and
# one line a second still shows an attack without letting it write the log.
RAFT_PEER_WARNING_LOG_INTERVAL_MS = 1_000
# Peer secrets a member holds at once (raft_secret_file, one per line: the first sends, all
# receive; peer_keys.py). A rotation needs two (SECURITY.md "What SIGHUP reloads"); a frame
# no secret opens is checked against each of them (an HMAC each, for its timestamp and again
# for its body), so this bounds what a stranger's frame costs. 4 leaves room for a rotation
# begun before the last one finished.
RAFT_SECRETS_MAX = 4
# -- the journal ---------------------------------------------------------------------
# Snapshot and compact once the journal has grown by this many bytes since its last compaction
# (as well as by entry count or age). Every member keeps its uncompacted entries in memory and
# on disk; by count alone (50,000 entries) 64 KiB writes made that 3 GiB. 64 MiB is ~1,000 such
# writes: a snapshot per 64 MiB written costs a fraction of the writes, and a member's journal
# memory and file stay near this whatever the write size (server config
# log_compaction_min_bytes).
RAFT_COMPACTION_BYTES_DEFAULT = 64 * 1024 * 1024
# -- finding members -----------------------------------------------------------------
# How long the Raft thread waits for a fresh lookup of a member's name (every connection attempt
# looks it up again: addresses.py). Measured here: /etc/hosts 0.04 ms, a failing DNS lookup
# 0.8 ms; a cluster DNS answers in a few ms. A slower lookup answers the next attempt instead,
# so a DNS server that hangs stalls the Raft thread this long once per lookup, far below a
# heartbeat (100 ms) and an election timeout (1 s).
RAFT_RESOLVE_WAIT_MS = 50
# A connection attempt to a member that has not completed within this many ms is abandoned and
# retried (with a fresh lookup). pysyncobj checks its timeout only when the socket reports an
# event, so a connect to an address nobody answers any more (a member that moved: its old pod
# IP drops SYNs) waited out the kernel's SYN retries, about two minutes. 2 s covers one lost SYN
# (retransmitted after 1 s).
RAFT_CONNECT_TIMEOUT_MS = 2_000

# Membership (membership.py): members in one configuration (Raft needs a majority of them; a
# bound keeps every quorum count and configuration entry small), a member id's characters,
# and a cluster id's (ours are 32 hex characters; a peer's longer one is refused on the wire).
RAFT_MEMBERS_MAX = 9
RAFT_MEMBER_ID_CHARS_MAX = 64
RAFT_CLUSTER_ID_CHARS_MAX = 64
# A member left out of the configuration says so (and what an operator must do) at most
# once per this many milliseconds.
RAFT_NOT_A_MEMBER_LOG_INTERVAL_MS = 5_000
# Read-index reads (read_index.py) waiting on the leader at once; beyond it a read goes
# through the log instead. Each is a few hundred bytes; the service's in-flight bound
# (inflight_proposals_max) usually keeps them far below.
RAFT_READ_INDEX_WAITING_MAX = 10_000

# -- the lease clock -----------------------------------------------------------------
# How far one leader stamp may move the log clock past the previous one (stamp_clock.py). A
# monotonic clock that jumps (a VM resumed, a faked clock) shortens a lease by at most this;
# the leader's lease_tick_interval_s TICKs stamp well within it, so an idle cluster's clock
# still keeps time, and a leader stalled longer than it (GC, a starved CPU) only makes leases
# run longer, never shorter. 2 s is a few ticks on a loaded 2-core machine.
STAMP_ADVANCE_MS_MAX = 2_000
