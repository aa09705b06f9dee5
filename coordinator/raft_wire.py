"""Byte formats of the Raft layer that need no pysyncobj: shared entries and the wire's zlib.

Owns: the encoding of an entry that carries several commands, and a zlib stream of stored
(uncompressed) blocks for Raft messages. Must never: import pysyncobj (raft_node.py is the
one module that does) or decide what a command means (the state machine does).
"""

from __future__ import annotations

import struct
import zlib

import msgpack

from . import limits

# First byte of an entry that carries several commands. 0xc1 is the one byte msgpack never
# uses, so no single command (a msgpack array) can start with it.
SHARED_ENTRY_MARKER = b"\xc1"


def encode_shared_entry(commands: list[bytes]) -> bytes:
    return SHARED_ENTRY_MARKER + msgpack.packb(commands, use_bin_type=True)


def decode_shared_entry(entry: bytes) -> list[bytes] | None:
    """The commands of a shared entry, or None if ``entry`` is not a well-formed one."""
    if entry[:1] != SHARED_ENTRY_MARKER:
        return None
    try:
        commands = msgpack.unpackb(
            entry[1:], use_list=True, raw=False,
            max_array_len=limits.RAFT_ENTRY_COMMANDS_MAX, max_bin_len=limits.RAFT_ENTRY_BYTES_MAX,
        )
    except Exception:  # noqa: BLE001 - any decoding failure: not a shared entry
        return None
    if not isinstance(commands, list) or not commands or not all(isinstance(c, bytes) for c in commands):
        return None
    return commands


# Every Raft message is zlib.compress(pickle, 3)'d before it is sent (tcp_connection.py:144).
# For the small messages Raft sends all the time that costs 60-90 us each (zlib sets up
# its state per call), an append goes to each follower, and nothing here gains from
# compression (appends carry msgpack commands, mostly random op_ids). Below this size
# messages go out as a zlib stream of stored blocks: the same format, so any pysyncobj
# peer still decompresses it (tcp_connection.py:291), for the cost of an Adler-32.
ZLIB_STORED_BELOW_BYTES = 64 * 1024


def zlib_stored(data: bytes) -> bytes:
    """``data`` as a valid zlib stream of uncompressed ("stored") deflate blocks (RFC 1950/1951)."""
    out = [b"\x78\x01"]  # CMF: deflate, 32 KiB window; FLG: no dictionary, check bits ok
    view = memoryview(data)
    step = 0xFFFF
    for pos in range(0, max(len(data), 1), step):
        chunk = view[pos : pos + step]
        final = pos + step >= len(data)
        out.append(struct.pack("<BHH", 1 if final else 0, len(chunk), len(chunk) ^ 0xFFFF))
        out.append(chunk)
    out.append(struct.pack(">I", zlib.adler32(data)))
    return b"".join(out)
