"""Every limit of the product, in one place, each named with its unit last.

Owns: numbers. Must never: import anything but the standard library.
Each value carries a one-line reason; DESIGN.md §2 and the README quote them.
"""

# Tokens are unsigned 64-bit (DESIGN §2). 0 is never issued: it means "no token".
TOKEN_MAX = 2**64 - 1

# Resource names: 1-256 bytes of [A-Za-z0-9._/:-] (DESIGN §2).
RESOURCE_NAME_BYTES_MAX = 256
# Keys inside a resource: same charset; short keys keep snapshots and dedup cheap.
KEY_BYTES_MAX = 256
# One value fits in one Raft entry far below the append-entries batch size, so
# pysyncobj's buggy split-transmission path (syncobj.py:1276-1281) is never taken.
VALUE_BYTES_MAX = 64 * 1024
# Holder is a free-form label (host/pid/task) for operators; bounded like a key.
HOLDER_BYTES_MAX = 128
# op_id: client-chosen id of one logical mutation (DESIGN §2: 16-64 bytes).
OP_ID_BYTES_MIN = 16
OP_ID_BYTES_MAX = 64

# Lease TTL: below 100 ms a keep-alive cannot round-trip through Raft in time;
# above one hour a crashed holder blocks its resource for too long.
LEASE_TTL_MS_MIN = 100
LEASE_TTL_MS_MAX = 60 * 60 * 1000

# Dedup table (DESIGN I5): an op_id's first outcome is kept for this long on the
# log clock, and at most this many entries; the oldest go first. Ten minutes covers
# any sane client retry loop; 100k entries bound memory to tens of MB.
DEDUP_RETENTION_MS = 10 * 60 * 1000
DEDUP_ENTRIES_MAX = 100_000

# State-size bounds, so a misbehaving client cannot grow every replica without limit.
RESOURCES_MAX = 100_000
KEYS_PER_RESOURCE_MAX = 1_024

# Largest encoded command accepted by propose(): a value plus its envelope.
COMMAND_BYTES_MAX = VALUE_BYTES_MAX + 4 * 1024

# Log-clock stamps (ms): exact in a double for any client, and stamp + any TTL fits int64.
STAMP_MS_MAX = 2**53 - 1
# Items per msgpack array/map in one command (largest body has 6 fields): caps decoder allocation.
COMMAND_ITEMS_MAX = 16

# Commands proposed at once on one node share one Raft entry (raft_node batching): at
# most this many, and this many bytes of commands. Far below the Raft batch size
# (appendEntriesBatchSizeBytes), so a shared entry never takes the split path either.
RAFT_ENTRY_COMMANDS_MAX = 256
RAFT_ENTRY_BYTES_MAX = 1024 * 1024

# -- admin restore (DESIGN I11) --------------------------------------------------
# A backup restored through Admin.Restore travels as one Raft entry. 4 MiB holds tens of
# thousands of resources with small values; bigger states need a bigger limit *and* a
# matching Raft batch size (raft_node keeps appendEntriesBatchSizeBytes above
# RESTORE_COMMAND_BYTES_MAX so pysyncobj never splits an entry).
RESTORE_SNAPSHOT_BYTES_MAX = 4 * 1024 * 1024
# The RESTORE command: the snapshot plus its envelope and fields.
RESTORE_COMMAND_BYTES_MAX = RESTORE_SNAPSHOT_BYTES_MAX + 4 * 1024

# -- Raft peer messages ------------------------------------------------------------
# What pysyncobj sends in one append: entries up to its batch size (raft_node sets it to
# RAFT_BATCH_BYTES) plus the one entry that crosses it, and at most RAFT_APPEND_ENTRIES_MAX
# entries (raft_node caps the count; stock pysyncobj has no cap).
RAFT_BATCH_BYTES = max(512 * 1024, 4 * COMMAND_BYTES_MAX, 2 * RESTORE_COMMAND_BYTES_MAX, 2 * RAFT_ENTRY_BYTES_MAX)
RAFT_APPEND_ENTRIES_MAX = 4096
# One Raft message, as framed on the wire and once inflated: a member drops a connection
# whose next frame declares more, or inflates to more, instead of buffering up to the 2 GiB a
# 32-bit length allows or expanding a small deflated frame without end. Above the largest
# append a member of ours sends (batch + one restore entry + per-entry pickle overhead ~30 B;
# tests/test_raft_peer_input.py builds it).
RAFT_MESSAGE_BYTES_MAX = 32 * 1024 * 1024
assert RAFT_MESSAGE_BYTES_MAX > RAFT_BATCH_BYTES + RESTORE_COMMAND_BYTES_MAX + 64 * RAFT_APPEND_ENTRIES_MAX
# Incoming Raft connections that have not named a member yet. pysyncobj keeps them with no
# deadline and no count, so idle ones from anyone would pile up (each a file descriptor and
# up to a frame of memory). A member names itself in its first message (after one key
# exchange with the secret), within milliseconds: at most this many wait at once, the
# oldest is dropped for a new one, and each is dropped if it names no member in time.
RAFT_UNNAMED_CONNECTIONS_MAX = 16
RAFT_NAMING_DEADLINE_MS = 5_000
# Connections the kernel completes on a Raft port before the member accepts them.
# pysyncobj listens with 5 (tcp_server.py:42): a stranger who kept that full made a member's
# reconnect wait on SYN retransmits (1 s, then 3 s). Accepted, they meet the bounds above.
# (The kernel caps it at net.core.somaxconn, 4096 by default.)
RAFT_LISTEN_BACKLOG = 128

# -- gRPC service -----------------------------------------------------------------
# Largest gRPC message in either direction: a restore request or a snapshot reply, plus
# framing. Everything else is far smaller (a value is at most VALUE_BYTES_MAX).
GRPC_MESSAGE_BYTES_MAX = RESTORE_SNAPSHOT_BYTES_MAX + 64 * 1024
# Acquire.wait_ms is clamped to this: a server-side wait holds a thread, so it stays
# short; clients that need longer waits loop.
ACQUIRE_WAIT_MS_MAX = 30_000
# Items in one KeepAliveMany call: each item is one Raft entry; 1,000 keep-alives fit in
# well under a second and bound the work one call can queue.
KEEP_ALIVE_BATCH_ITEMS_MAX = 1_000
