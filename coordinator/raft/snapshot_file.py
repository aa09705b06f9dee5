"""The snapshot (dump) file: msgpack behind a checksummed header, written with fsync.

Owns: the file's format (``DUMP_NAME``, magic, version, the (index, term) of its last entry,
crc32 of the body), writing it durably, and checking and reading it back.
Must never: import pysyncobj (it renames the file into place; ``replica.py`` hands our
serializer to it), or touch the state machine (the caller passes its state in and gets it out).
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Any

import msgpack

DUMP_NAME = "raft.dump"

_MAGIC = b"FNCDUMP\x00"
_HEAD = struct.Struct("<8sIQQI")  # magic, version, last index, last term, crc32(body)
_VERSION = 1

Entry = tuple[bytes, int, int]  # pysyncobj's (command, index, term)


def write(path: str, last: Entry, prev: Entry, state: Any, config: Any = None) -> None:
    """Write the snapshot whose last entries are ``last`` and ``prev``, and fsync it.

    ``config``: the cluster configuration in effect at ``last`` (membership.py's plain form),
    or None; the CONFIG entry that set it is compacted away with the journal."""
    body = msgpack.packb([list(last), list(prev), state, config], use_bin_type=True)
    _write_durably(path, last, [body])


def write_pieces(path: str, last: Entry, prev: Entry, state_pieces: list[bytes], config: Any = None) -> None:
    """``write`` for a state given as pieces of bytes (``StateMachine.snapshot_pieces``): the
    same file as ``write(path, last, prev, b"".join(state_pieces), config)``, without joining
    the pieces or packing the state into a second copy."""
    packer = msgpack.Packer(use_bin_type=True)
    state_bytes = sum(len(piece) for piece in state_pieces)
    head = b"".join([packer.pack_array_header(4), packer.pack(list(last)), packer.pack(list(prev))])
    body = [head + _bin_header(state_bytes), *state_pieces, packer.pack(config)]
    _write_durably(path, last, body)


def _bin_header(size: int) -> bytes:
    # msgpack's bin 8/16/32 header (use_bin_type=True packs bytes so); the library has no
    # public call for the header alone.
    if size < 1 << 8:
        return b"\xc4" + struct.pack(">B", size)
    if size < 1 << 16:
        return b"\xc5" + struct.pack(">H", size)
    if size < 1 << 32:
        return b"\xc6" + struct.pack(">I", size)
    raise ValueError(f"a snapshot state of {size} bytes exceeds msgpack's bin 32")


def _write_durably(path: str, last: Entry, body: list[bytes]) -> None:
    crc = 0
    for piece in body:
        crc = zlib.crc32(piece, crc)
    head = _HEAD.pack(_MAGIC, _VERSION, last[1], last[2], crc)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for piece in (head, *body):
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)  # renamed into place after this (serializer.py:93, snapshot_writer.py)
    finally:
        os.close(fd)


# Read at a time when a snapshot is only checked: verifying never holds the file whole.
_VERIFY_CHUNK_BYTES = 1 << 20
# Fed at a time to find where the state starts: the two entries before it are small, or one
# log entry at most (a 64 KiB value, its command around it) each.
_HEAD_CHUNK_BYTES = 1 << 16


def verify(path: str) -> tuple[int, int]:
    """Check a snapshot file's header and checksum; return its (last index, last term).

    Streams the file: a member checks its snapshot before loading it, and at a 40 MB snapshot
    reading it whole here, then again to load it, doubled the start's peak memory."""
    with open(path, "rb") as f:
        index, term, crc = _check_head(path, f.read(_HEAD.size))
        got = 0
        while chunk := f.read(_VERIFY_CHUNK_BYTES):
            got = zlib.crc32(chunk, got)
    if got != crc:
        raise ValueError(f"{path}: snapshot checksum mismatch")
    return index, term


def read_body(path: str) -> memoryview:
    """The checked body of a snapshot file (ValueError when damaged); ``decode`` reads it.

    A view into the file's bytes, not a copy of them past the header."""
    with open(path, "rb") as f:
        raw = f.read()
    _index, _term, crc = _check_head(path, raw[: _HEAD.size])
    body = memoryview(raw)[_HEAD.size :]
    if zlib.crc32(body) != crc:
        raise ValueError(f"{path}: snapshot checksum mismatch")
    return body


def _check_head(path: str, head: bytes) -> tuple[int, int, int]:
    if len(head) < _HEAD.size:
        raise ValueError(f"{path}: snapshot shorter than its header")
    magic, version, index, term, crc = _HEAD.unpack(head)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"{path}: not a snapshot of format {_VERSION}")
    return index, term, crc


def decode(body: bytes | memoryview) -> tuple[Entry, Entry, Any, Any]:
    """(last entry, previous entry, state, configuration or None) of a checked body.

    A state packed as bytes (the state machine's own encoding, ``write_pieces``) comes back as
    a view into ``body``, not a copy: at a 40 MB state the copy was one more state in memory
    while the member loads. Any other state is unpacked as msgpack.
    Snapshots written before configurations were recorded have three parts: no configuration."""
    view = memoryview(body)
    fed = 0
    while True:
        # A fresh reader for each longer prefix: OutOfData may leave a partly read item behind.
        fed = min(len(view), fed + _HEAD_CHUNK_BYTES)
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(1, len(view)))
        unpacker.feed(view[:fed])
        try:
            parts = unpacker.read_array_header()
            last, prev = unpacker.unpack(), unpacker.unpack()
            break
        except msgpack.OutOfData:
            if fed >= len(view):
                raise ValueError("snapshot body ends before its state") from None
    if not 3 <= parts <= 4:
        raise ValueError(f"snapshot body has {parts} parts, not 3 or 4")
    start = unpacker.tell()
    size, header = _bin_span(view, start)
    if size is None:
        whole = msgpack.unpackb(view, raw=False)
        return _entry_tuple(last), _entry_tuple(prev), whole[2], whole[3] if parts > 3 else None
    end = start + header + size
    if end > len(view):
        raise ValueError("snapshot body ends inside its state")
    state = view[start + header : end]
    config = msgpack.unpackb(view[end:], raw=False) if parts > 3 else None
    return _entry_tuple(last), _entry_tuple(prev), state, config


def _bin_span(view: memoryview, at: int) -> tuple[int | None, int]:
    """(payload size, header size) of the msgpack bin item at ``at``; (None, 0) if another type."""
    kind = view[at] if at < len(view) else None
    for code, form in ((0xC4, ">B"), (0xC5, ">H"), (0xC6, ">I")):
        if kind == code:
            width = struct.calcsize(form)
            if at + 1 + width > len(view):
                raise ValueError("snapshot body ends inside its state's header")
            return struct.unpack_from(form, view, at + 1)[0], 1 + width
    return None, 0


def _entry_tuple(entry) -> Entry:
    # pysyncobj compares entries as tuples (syncobj.py:1489-1495); a list from
    # msgpack would never compare equal and the journal would be cleared.
    return (bytes(entry[0]), int(entry[1]), int(entry[2]))
