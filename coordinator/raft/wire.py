"""Byte formats of the Raft layer that need no pysyncobj: shared entries, the wire's zlib,
and the unpickling of what peers send.

Owns: the encoding of an entry that carries several commands, a zlib stream of stored
(uncompressed) blocks for Raft messages, and ``plain_loads``, an unpickler that builds only
plain data. Must never: import pysyncobj (the modules that wrap it use these formats) or
decide what a command means (the state machine does).
"""

from __future__ import annotations

import io
import pickle
import struct
import zlib

import msgpack

from coordinator.raft import limits as raft_limits

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
            max_array_len=raft_limits.RAFT_ENTRY_COMMANDS_MAX, max_bin_len=raft_limits.RAFT_ENTRY_BYTES_MAX,
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


class FrameTooLarge(ValueError):
    """A Raft frame declares, or inflates to, more than raft_limits.RAFT_MESSAGE_BYTES_MAX."""


def bounded_inflate(data: bytes, max_bytes: int = raft_limits.RAFT_MESSAGE_BYTES_MAX) -> bytes:
    """``zlib.decompress(data)``, refused past ``max_bytes`` of output.

    zlib inflates up to ~1000x, so a frame well within the frame bound could otherwise
    grow to gigabytes before anything looks at it. A stream that is cut short, or has
    bytes after its end, is refused like a corrupt one.
    """
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, max_bytes)
    if inflater.unconsumed_tail:
        raise FrameTooLarge(f"a Raft frame inflates to more than {max_bytes} bytes")
    if not inflater.eof or inflater.unused_data:
        raise zlib.error("a Raft frame is not one complete zlib stream")
    return out


# pysyncobj's frame: a native-endian signed 32-bit length, then that many bytes
# (tcp_connection.py:141-149, 277-283).
FRAME_HEAD = struct.Struct("i")


def scan_frames(buffer: bytes, start: int, max_bytes: int = raft_limits.RAFT_MESSAGE_BYTES_MAX) -> int:
    """Check every frame head in ``buffer`` from offset ``start`` (a frame boundary).

    Returns the offset of the first frame not yet complete (where the next scan starts),
    so each head is read once however the bytes arrive. Raises FrameTooLarge for a head
    that declares more than ``max_bytes`` (or a negative length) before its bytes are in.
    """
    pos = start
    end = len(buffer)
    while pos + FRAME_HEAD.size <= end:
        (length,) = FRAME_HEAD.unpack_from(buffer, pos)
        if length < 0 or length > max_bytes:
            raise FrameTooLarge(f"a Raft frame declares {length} bytes; at most {max_bytes} are accepted")
        if pos + FRAME_HEAD.size + length > end:
            break
        pos += FRAME_HEAD.size + length
    return pos


# pysyncobj frames every Raft message as pickle (tcp_connection.py:144, 291) and stores every
# log entry as a pickled call (syncobj.py:894, 1599), so whoever reaches a Raft port, or gets an
# entry into the log, would run code on every member (PYSYNCOBJ.md). Everything pysyncobj puts
# there is plain data: dicts, lists, tuples, bytes, str, int, float, bool, None. pickle can only
# reach code through find_class (GLOBAL, STACK_GLOBAL, INST, OBJ and the EXT* registry all go
# through it; REDUCE/NEWOBJ/BUILD need an object only find_class can make) or through a
# persistent_load hook, which we never define. So find_class below hands out two harmless
# stand-ins and refuses every other name: the pickle documentation's "Restricting Globals".
#
# The stand-ins exist because pysyncobj pickles with protocol 2 (pysyncobj/pickle.py), which
# has no opcode for bytes: b"" is written as a call of builtins.bytes() and any other bytes
# as _codecs.encode(text, "latin1"). Journals on disk hold entries written that way.


class RefusedPickle(pickle.UnpicklingError):
    """A pickle that calls anything but the two bytes constructors: never pysyncobj's own."""


def _latin1_bytes(text, encoding):
    if type(text) is not str or encoding != "latin1":
        raise RefusedPickle("_codecs.encode is accepted only as protocol 2 writes bytes (str, 'latin1')")
    return text.encode("latin1")


def _empty_bytes(*args):
    if args:
        raise RefusedPickle("builtins.bytes is accepted only without arguments (protocol 2's b'')")
    return b""


_BYTES_CONSTRUCTORS = {
    ("_codecs", "encode"): _latin1_bytes,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
}


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _BYTES_CONSTRUCTORS[(module, name)]
        except KeyError:
            raise RefusedPickle(f"pickle names {module}.{name}; only plain data is accepted from peers") from None


# What we pickle with: protocol 5 has an opcode for bytes, so it needs no global at all, and
# it is ~6x faster to write and ~3x faster to read back than pysyncobj's protocol 2 for an
# append of four entries (measured: 0.65 vs 4.2 us, 2.0 vs 6.5 us; 463 vs 717 bytes). Any
# Python 3 pysyncobj reads it; plain_loads still reads protocol 2 (journals on disk).
PICKLE_PROTOCOL = 5


def dumps(value) -> bytes:
    return pickle.dumps(value, protocol=PICKLE_PROTOCOL)


def plain_loads(data: bytes):
    """``pickle.loads`` for peer input: plain data only; a pickle that calls anything else is refused."""
    return _PlainDataUnpickler(io.BytesIO(data)).load()
