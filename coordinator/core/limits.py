"""Every limit of the product's API and state, each named with its unit last.

Owns: numbers. Must never: import anything but the standard library.
The Raft transport's own limits (entry batching, peer frames, connection admission) depend
on the Raft library's internals and live in ``coordinator/raft/limits.py``.
Each value carries a one-line reason; DESIGN.md §2 and the README quote them.
"""

# Tokens are unsigned 64-bit (DESIGN §2). 0 is never issued: it means "no token".
TOKEN_MAX = 2**64 - 1

# Resource names: 1-256 bytes of [A-Za-z0-9._/:-] (DESIGN §2).
RESOURCE_NAME_BYTES_MAX = 256
# Keys inside a resource: same charset; short keys keep snapshots and dedup cheap.
KEY_BYTES_MAX = 256
# One value fits in one Raft entry far below the append-entries batch size, so the Raft
# library's split-transmission path is never taken (coordinator/raft/limits.py).
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

# -- per-principal quotas (a principals file entry may set its own; DESIGN §8) ----------
# Defaults for a non-admin principal that sets none. Admin principals and a cluster without a
# principals file have no quota of their own (only the cluster-wide limits above).
# A tenth of RESOURCES_MAX: one tenant alone cannot take the cluster's resource limit.
PRINCIPAL_RESOURCES_MAX = 10_000
# Every live lease is one resource at least, so no more leases than resources.
PRINCIPAL_LEASES_MAX = 10_000
# Keys + values one principal stores: 16 MiB keeps a member's memory and a snapshot of
# dozens of tenants within a few hundred MiB (without it a tenant could grow every member
# by RESOURCES_MAX * KEYS_PER_RESOURCE_MAX * VALUE_BYTES_MAX).
PRINCIPAL_STORED_BYTES_MAX = 16 * 1024 * 1024
# Open KeepAliveStreams per principal: each holds a gRPC worker thread for its life, and 8
# leaves most of the default 64 threads to other callers.
PRINCIPAL_STREAMS_MAX = 8
# Largest quota a principals file or a command may state: fits msgpack's int64 and every
# count above is far below it.
QUOTA_VALUE_MAX = 2**63 - 1
# Principal names are stored on every resource a principal owns (and in snapshots): bounded
# like a holder label.
PRINCIPAL_NAME_BYTES_MAX = 128

# Largest encoded command accepted by propose(): a value plus its envelope.
COMMAND_BYTES_MAX = VALUE_BYTES_MAX + 4 * 1024

# Log-clock stamps (ms): exact in a double for any client, and stamp + any TTL fits int64.
STAMP_MS_MAX = 2**53 - 1
# Items per msgpack array/map in one command (largest body has 6 fields): caps decoder allocation.
COMMAND_ITEMS_MAX = 16
# A resource's revision (and so a key's version): live writes add one per entry and never come
# near; a restored revision at most this leaves 2^63 writes before a uint64 version overflows.
REVISION_MAX = 2**63 - 1
# A Raft log index kept in state (a dedup entry's first index): Raft indexes live in
# [0, 2^63), the range the Raft wire accepts, so nothing live is ever larger.
RAFT_INDEX_MAX = 2**63 - 1

# -- admin restore (DESIGN I11) --------------------------------------------------
# A backup restored through Admin.Restore travels as one Raft entry. 4 MiB holds tens of
# thousands of resources with small values; bigger states need a bigger limit *and* a
# matching Raft batch size (coordinator/raft/limits.py keeps RAFT_BATCH_BYTES above
# RESTORE_COMMAND_BYTES_MAX so an entry is never split).
RESTORE_SNAPSHOT_BYTES_MAX = 4 * 1024 * 1024
# The RESTORE command: the snapshot plus its envelope and fields.
RESTORE_COMMAND_BYTES_MAX = RESTORE_SNAPSHOT_BYTES_MAX + 4 * 1024

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
