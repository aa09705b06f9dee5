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


def verify(path: str) -> tuple[int, int]:
    """Check a snapshot file's header and checksum; return its (last index, last term)."""
    index, term, _body = _read_checked(path)
    return index, term


def read_body(path: str) -> bytes:
    """The checked body of a snapshot file (ValueError when damaged); ``decode`` reads it."""
    return _read_checked(path)[2]


def _read_checked(path: str) -> tuple[int, int, bytes]:
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < _HEAD.size:
        raise ValueError(f"{path}: snapshot shorter than its header")
    magic, version, index, term, crc = _HEAD.unpack_from(raw, 0)
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"{path}: not a snapshot of format {_VERSION}")
    body = raw[_HEAD.size :]
    if zlib.crc32(body) != crc:
        raise ValueError(f"{path}: snapshot checksum mismatch")
    return index, term, body


def decode(body: bytes) -> tuple[Entry, Entry, Any, Any]:
    """(last entry, previous entry, state, configuration or None) of a checked body.

    Snapshots written before configurations were recorded have three parts: no configuration."""
    parts = msgpack.unpackb(body, raw=False)
    last, prev, state = parts[:3]
    config = parts[3] if len(parts) > 3 else None
    return _entry_tuple(last), _entry_tuple(prev), state, config


def _entry_tuple(entry) -> Entry:
    # pysyncobj compares entries as tuples (syncobj.py:1489-1495); a list from
    # msgpack would never compare equal and the journal would be cleared.
    return (bytes(entry[0]), int(entry[1]), int(entry[2]))
