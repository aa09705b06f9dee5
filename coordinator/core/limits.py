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
# log clock. Ten minutes covers any sane client retry loop, and a caller's own retry after
# an unknown outcome.
DEDUP_RETENTION_MS = 10 * 60 * 1000
# Entries of all principals together (~300 B of every member each: 100k bound it to ~30 MB,
# and a snapshot's dedup array to ~49 MB). Past it the largest holder's oldest goes first
# (core/dedup.py), never the entry of a principal that holds fewer.
DEDUP_ENTRIES_MAX = 100_000

# State-size bounds, so a misbehaving client cannot grow every replica without limit. A million
# resources with a live lease and one short key each keep a member near 0.9 GiB (bench/README.md,
# "python -m bench scale"); every byte of name, holder or owner beyond short ones adds its byte a
# resource.
RESOURCES_MAX = 1_000_000
KEYS_PER_RESOURCE_MAX = 1_024

# -- per-principal quotas (a principals file entry may set its own; DESIGN §8) ----------
# Defaults for a non-admin principal that sets none. Admin principals and a cluster without a
# principals file have no quota of their own (only the cluster-wide limits above).
# A hundredth of RESOURCES_MAX: one tenant alone cannot take the cluster's resource limit. Not
# raised with it: a principal at its quota has its resources counted live by each Acquire it
# sends (machine_base._quota_refusal), a scan that grows with this number on every member.
PRINCIPAL_RESOURCES_MAX = 10_000
# Every live lease is one resource at least, so no more leases than resources.
PRINCIPAL_LEASES_MAX = 10_000
# Keys + values one principal stores: 16 MiB keeps a member's memory and a snapshot of
# dozens of tenants within a few hundred MiB (without it a tenant could grow every member
# by RESOURCES_MAX * KEYS_PER_RESOURCE_MAX * VALUE_BYTES_MAX).
PRINCIPAL_STORED_BYTES_MAX = 16 * 1024 * 1024
# op_ids one principal keeps in the dedup table (its retry window: past it, its own oldest
# entry goes first, never another principal's). A tenth of DEDUP_ENTRIES_MAX: ten tenants at
# their budget fit the table, and a tenant at 1,000 mutations/s still keeps 10 s of retries.
PRINCIPAL_DEDUP_ENTRIES_MAX = 10_000
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

# Cluster-wide bounds on fenced data, so "the largest state the limits allow" is a size, not
# RESOURCES_MAX * KEYS_PER_RESOURCE_MAX * VALUE_BYTES_MAX (6.7 TB): keys + values of every
# resource together (what PRINCIPAL_STORED_BYTES_MAX counts for one principal). 64 MiB is four
# default tenants at their quota and keeps a member's memory and its snapshot within a few
# hundred MiB; a write past it is refused LIMIT_EXCEEDED (limit "state_stored_bytes").
STATE_STORED_BYTES_MAX = 64 * 1024 * 1024
# Keys across all resources: an empty value costs its key's bytes only, so without a count 64 MiB
# of one-byte keys would be 67M keys (~200 B of a member's memory and up to 24 B of snapshot
# framing each). One key for each of RESOURCES_MAX resources, 67 B each on average at the byte
# limit; past it a write of a new key is refused LIMIT_EXCEEDED (limit "state_keys").
STATE_KEYS_MAX = 1_000_000

# -- the largest snapshot (derived: tests/test_backup_size.py builds the fullest state) ---------
# msgpack framing maxima, written out below: an array, str or bin head is at most 5 bytes,
# an integer at most 9.
# One resource without its keys: [name, hwm, revision, [holder, token, ttl_ms, expires_at_ms],
# [keys...], owner].
SNAPSHOT_RESOURCE_BYTES_MAX = (
    5 + (5 + RESOURCE_NAME_BYTES_MAX) + 2 * 9 + (5 + (5 + HOLDER_BYTES_MAX) + 3 * 9) + 5
    + (5 + PRINCIPAL_NAME_BYTES_MAX)
)
# One key's framing, [key, value, version]: its key and value bytes count in STATE_STORED_BYTES_MAX.
SNAPSHOT_KEY_FRAMING_BYTES_MAX = 3 * 5 + 9
# A dedup entry's stored outcome, [1, op, result]: results are flat maps of at most three short
# names to integers or booleans (~60 B measured); the test holds every op's largest under it.
SNAPSHOT_DEDUP_OUTCOME_BYTES_MAX = 128
# One dedup entry: [op_id, op, resource, outcome, applied_at_ms, first_index, principal].
SNAPSHOT_DEDUP_ENTRY_BYTES_MAX = (
    5 + (5 + OP_ID_BYTES_MAX) + 9 + (5 + RESOURCE_NAME_BYTES_MAX) + SNAPSHOT_DEDUP_OUTCOME_BYTES_MAX + 2 * 9
    + (5 + PRINCIPAL_NAME_BYTES_MAX)
)
# The document around them: magic, format version, epoch, log clock, array heads, no staging.
SNAPSHOT_FRAME_BYTES_MAX = 1024
# The largest backup (a snapshot without a restore in progress) the limits allow, ~740 MB (a
# million resources of the longest names, holders and owners; short ones with a 32-byte value
# each make ~92 MB, bench scale). A restore may be no larger; a member's own snapshot may be
# up to twice it while a restore is staged (the staged backup is part of it).
BACKUP_BYTES_MAX = (
    SNAPSHOT_FRAME_BYTES_MAX
    + RESOURCES_MAX * SNAPSHOT_RESOURCE_BYTES_MAX
    + STATE_KEYS_MAX * SNAPSHOT_KEY_FRAMING_BYTES_MAX
    + STATE_STORED_BYTES_MAX
    + DEDUP_ENTRIES_MAX * SNAPSHOT_DEDUP_ENTRY_BYTES_MAX
)

# -- admin snapshot and restore (DESIGN I11) --------------------------------------------------
# Snapshots and restores travel in chunks of at most this many bytes: each SnapshotStream and
# RestoreStream message, and each RESTORE_CHUNK entry of the log. 1 MiB keeps a gRPC message far
# under GRPC_MESSAGE_BYTES_MAX and an entry far under the Raft batch size (never split), while
# the largest backup is ~707 entries.
BACKUP_CHUNK_BYTES = 1024 * 1024
# A RESTORE_CHUNK command: the chunk plus its envelope and fields.
RESTORE_CHUNK_COMMAND_BYTES_MAX = BACKUP_CHUNK_BYTES + 4 * 1024
# Chunks of one restore: BACKUP_BYTES_MAX in BACKUP_CHUNK_BYTES pieces (a chunk's seq is below it).
RESTORE_CHUNKS_MAX = -(-BACKUP_BYTES_MAX // BACKUP_CHUNK_BYTES)
# A restore's id: 16 random bytes chosen by the member that runs it (like an op_id).
RESTORE_ID_BYTES = 16
# A staged restore untouched for this long on the log clock is stale: a new RESTORE_BEGIN replaces
# it and a TICK drops it. Chunks arrive milliseconds apart; a minute outlasts any election, while
# a member that died mid-restore blocks the next one no longer than that.
RESTORE_STAGING_IDLE_MS = 60_000
# Backup transfers (snapshots and restores, streamed or unary) one member runs at once: each holds
# up to BACKUP_BYTES_MAX in memory, so two bound that to ~1.5 GB at the worst the limits allow
# (~185 MB at a million short-named resources); a third is refused OVERLOADED.
BACKUP_TRANSFERS_MAX = 2
# The unary Admin.Snapshot and Admin.Restore carry a backup in one gRPC message: 4 MiB.
# Larger backups go through SnapshotStream and RestoreStream.
RESTORE_SNAPSHOT_BYTES_MAX = 4 * 1024 * 1024
# The largest Raft entry the Raft layer is sized for (coordinator/raft/limits.py): a unary
# backup plus an envelope; every command, a RESTORE_CHUNK included, is smaller.
RESTORE_COMMAND_BYTES_MAX = RESTORE_SNAPSHOT_BYTES_MAX + 4 * 1024
assert RESTORE_CHUNK_COMMAND_BYTES_MAX <= RESTORE_COMMAND_BYTES_MAX, "a chunk entry fits the Raft bounds"

# -- gRPC service -----------------------------------------------------------------
# Largest gRPC message in either direction: a unary restore request or snapshot reply, plus
# framing. Everything else is far smaller (a value is VALUE_BYTES_MAX, a chunk BACKUP_CHUNK_BYTES).
GRPC_MESSAGE_BYTES_MAX = RESTORE_SNAPSHOT_BYTES_MAX + 64 * 1024
# Acquire.wait_ms is clamped to this: a server-side wait holds a thread, so it stays
# short; clients that need longer waits loop.
ACQUIRE_WAIT_MS_MAX = 30_000
# Items in one KeepAliveMany call: each item is one Raft entry; 1,000 keep-alives fit in
# well under a second and bound the work one call can queue.
KEEP_ALIVE_BATCH_ITEMS_MAX = 1_000
# Items in one WriteMany call: each item takes one of a member's inflight_proposals_max slots
# (default 256) while it waits for its entry, so one call can hold at most a quarter of them;
# 64 is also the most concurrent writers one client process is expected to coalesce.
WRITE_MANY_ITEMS_MAX = 64
# Encoded WriteRequest bytes in one WriteMany call (the items' serialized sizes summed): 16
# writes of the largest value, far under GRPC_MESSAGE_BYTES_MAX, so one call cannot make a
# member decode and hold megabytes at once; a client splits larger batches.
WRITE_MANY_BYTES_MAX = 1024 * 1024
# Items in one AcquireMany / ReleaseMany call: the same bound as WRITE_MANY_ITEMS_MAX for the
# same reason (each item holds an inflight_proposals_max slot while its entry commits). No
# bytes cap of their own: an item's fields are bounded (resource, holder, op_id), so 64 items
# are at most a few tens of KiB.
ACQUIRE_MANY_ITEMS_MAX = 64
RELEASE_MANY_ITEMS_MAX = 64

# -- the lock wait queue (FIFO waiters per resource; state_machine ENQUEUE/DEQUEUE) ---------
# Waiters queued on one resource: a queue longer than this waits minutes behind short leases,
# and each waiter is replicated state; past it an ENQUEUE is refused LIMIT_EXCEEDED.
LOCK_WAITERS_PER_RESOURCE_MAX = 64
# Waiters one principal may have queued across all resources: a tenant cannot fill the
# cluster's queue (LOCK_WAITERS_MAX) alone.
LOCK_WAITERS_PER_PRINCIPAL_MAX = 256
# Waiters in the whole cluster: each costs ~400 B of every member's memory and snapshot, so
# 10,000 keep the queue within ~4 MB.
LOCK_WAITERS_MAX = 10_000
# A waiter whose client stops renewing its slot (a Lock call renews it) is dropped this long
# after its last renewal: long enough for four server-side waits of LOCK_WAIT_MS_MAX plus an
# election, short enough that a vanished client leaves the queue within half a minute.
LOCK_WAITER_TTL_MS = 30_000
# A waiting Acquire queues once (its op_id is its waiter id) and does not renew its slot, so
# its longest wait must end before the slot would expire.
assert ACQUIRE_WAIT_MS_MAX <= LOCK_WAITER_TTL_MS, "a waiting Acquire outlives its queue slot"
# One Lock call waits server-side at most this long for its grant (it holds a gRPC worker
# thread and an acquire_waiters_max slot), then answers "still queued" and the client calls
# again: one ENQUEUE renewal entry per waiter per 5 s, never a poll per 100 ms.
LOCK_WAIT_MS_MAX = 5_000
# A waiter's id: client-chosen random bytes, sized like an op_id.
WAITER_ID_BYTES_MIN = 16
WAITER_ID_BYTES_MAX = 64

# -- List (a page of resources, read like Describe: Lease.List) -----------------------------
# Resources in one page when the request sets no limit: a screenful for fencingctl ls.
LIST_LIMIT_DEFAULT = 100
# Most resources in one page: the page is built under the member's apply lock (a search in the
# sorted names, then the names it returns: core/listing.py), and 1,000 items keep its reply
# under LIST_PAGE_BYTES_MAX.
LIST_LIMIT_MAX = 1_000
# Prefixes one List may cover at once (the request's prefix, narrowed to each of the caller's
# grants): they travel in one READ_BARRIER, whose arrays the decoder caps at COMMAND_ITEMS_MAX.
LIST_PREFIXES_MAX = 16
# One listed resource in the reply, at most: name and holder at their limits, five integers and
# a boolean with their field tags and the item's framing (tests/test_listing.py builds it).
LIST_ITEM_BYTES_MAX = (3 + RESOURCE_NAME_BYTES_MAX) + (3 + HOLDER_BYTES_MAX) + 5 * 11 + 2 + 4
# The largest ListResponse (a full page of the largest items, a page token and a header):
# ~450 KiB, far under GRPC_MESSAGE_BYTES_MAX, however many resources the cluster holds.
LIST_PAGE_BYTES_MAX = LIST_LIMIT_MAX * LIST_ITEM_BYTES_MAX + 2 * 1024
# A page token: the hex of the request's prefix and the last name of the page (validation.py).
LIST_PAGE_TOKEN_BYTES_MAX = 3 + 2 * (2 * RESOURCE_NAME_BYTES_MAX + 1)

# The highest entry level this build applies (commands.py "Entry levels"): a SET_CLUSTER_LEVEL
# above it is a field no check here passes, and a member that meets one stops (DESIGN §8).
ENTRY_LEVEL = 4
