"""Byte formats of the Raft layer that need no pysyncobj: the typed wire, log entries and
shared entries.

Owns: the Raft wire (``encode_frame`` / ``decode_frame``: msgpack with a version tag and a
fixed schema per message type, every field's type and range checked before anything acts
on it), the log entry format (``encode_entry``; ``ENTRY_VERSION``), the encoding of an entry
that carries several commands, and frame heads (``scan_frames``).
Must never: import pysyncobj (the modules that wrap it use these formats), decide what a
command means (the state machine does), or unpickle anything (RAFT.md "A typed wire").
"""

from __future__ import annotations

import hmac
import pickle
import struct
from typing import Callable

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
    # msgpack documents that "other exceptions can be raised during unpacking": any type.
    except Exception:  # noqa: BLE001 - not a shared entry
        return None
    if not isinstance(commands, list) or not commands or not all(isinstance(c, bytes) for c in commands):
        return None
    return commands


class FrameTooLarge(ValueError):
    """A Raft frame declares more than raft_limits.RAFT_MESSAGE_BYTES_MAX."""


# pysyncobj's frame: a native-endian signed 32-bit length, then that many bytes
# (tcp_connection.py:141-149, 277-283).
FRAME_HEAD = struct.Struct("i")


def scan_frames(buffer: bytes | bytearray, start: int, max_bytes: int = raft_limits.RAFT_MESSAGE_BYTES_MAX) -> int:
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


class RefusedPickle(pickle.UnpicklingError):
    """pickle as pysyncobj's modules see it (patches.py ``_NoPickle``): the Raft layer pickles nothing."""


# -- log entries ----------------------------------------------------------------------
# An entry is pysyncobj's command-type byte (syncobj.py:56-60; syncobj.py in this package
# checks these values against pysyncobj's) and, for our commands, ENTRY_VERSION and the
# command's bytes as the state machine reads them: no pickle. A new leader's NO_OP is the
# type byte alone (syncobj.py:168, 1227). Nothing else is a valid entry.
ENTRY_TYPE_REGULAR = 0
ENTRY_TYPE_NO_OP = 1
ENTRY_VERSION = 1
NO_OP_ENTRY = bytes((ENTRY_TYPE_NO_OP,))
_ENTRY_HEAD = bytes((ENTRY_TYPE_REGULAR, ENTRY_VERSION))
# A CONFIG entry (membership.py): the cluster's configuration, never handed to the state
# machine. Its second byte is no ENTRY_VERSION, so no command entry can be taken for one.
CONFIG_ENTRY_HEAD = bytes((ENTRY_TYPE_REGULAR, 0x43))


def encode_entry(command: bytes) -> bytes:
    """The log entry that carries ``command`` (one command, or a shared entry)."""
    return _ENTRY_HEAD + command


def entry_command(entry: bytes) -> bytes | None:
    """The command an entry carries; None for a NO_OP; raises ValueError for anything else."""
    if entry[:2] == _ENTRY_HEAD:
        return entry[2:]
    if entry == NO_OP_ENTRY or entry[:2] == CONFIG_ENTRY_HEAD:
        return None  # nothing for the state machine (a CONFIG took effect when appended)
    raise ValueError(f"not an entry of format {ENTRY_VERSION} (starts {bytes(entry[:2]).hex()})")


def _is_entry(value) -> bool:
    return type(value) is bytes and (
        value == NO_OP_ENTRY
        or (value[:2] in (_ENTRY_HEAD, CONFIG_ENTRY_HEAD) and len(value) <= raft_limits.RAFT_LOG_ENTRY_BYTES_MAX)
    )


# -- the Raft wire ---------------------------------------------------------------------
# A frame's body (after pysyncobj's length head, and inside Fernet with the secret) is one
# msgpack array: [WIRE_VERSION, kind, key, *fields]. ``key`` is the connection's random key
# once the secret's key exchange is done (pysyncobj wraps messages as (key, message),
# tcp_connection.py:141-143, 296-298), else nil. Each kind has a fixed list of fields, each
# with one type and range; a frame with another version, an unknown kind, a field missing or
# extra or of the wrong type, or a value out of range is refused whole (PeerMessageRefused) and
# its connection dropped: nothing in it reaches pysyncobj. msgpack maps and extension types
# never occur, so they are refused by the parser itself.
# 2: votes, appends (and snapshot chunks) and append acknowledgements carry the sender's
# cluster id and incarnation.
WIRE_VERSION = 2


class PeerMessageRefused(ValueError):
    """A frame that is not a well-formed message of the typed wire."""


class LegacyWireFrame(PeerMessageRefused):
    """A frame of pysyncobj's own wire (zlib of a pickle): a member of an older version."""


_INT_END = raft_limits.RAFT_WIRE_INT_END
_RAND_KEY_BYTES = 32  # os.urandom(32) in pysyncobj's key exchange (transport.py:344, 455)


def _int(value) -> bool:
    return type(value) is int and 0 <= value < _INT_END


def _opt_int(value) -> bool:
    return value is None or _int(value)


def _cluster_id(value) -> bool:
    return value is None or (type(value) is str and 0 < len(value) <= raft_limits.RAFT_CLUSTER_ID_CHARS_MAX)


def _incarnation(value) -> bool:
    return type(value) is int and 0 < value < _INT_END


def _bool(value) -> bool:
    return type(value) is bool


def _fail_code(value) -> bool:
    # pysyncobj's FAIL_REASON codes other than SUCCESS (config.py:2-10): an "error" of 0
    # would reach a callback as success without a result.
    return type(value) is int and 1 <= value <= 7


def _address(value) -> bool:
    return type(value) is str and 0 < len(value) <= raft_limits.RAFT_ADDRESS_CHARS_MAX


def is_connection_key(value) -> bool:
    """``value`` is a connection's random key: a binding handshake's nonce (peer_binding.py)."""
    return type(value) is bytes and len(value) == _RAND_KEY_BYTES


def _nonce(value) -> bool:
    return is_connection_key(value)  # a handshake nonce is the connection key of the side that reads


def _opt_nonce(value) -> bool:
    return value is None or _nonce(value)


def _member_id(value) -> bool:
    return type(value) is str and 0 < len(value) <= raft_limits.RAFT_MEMBER_ID_CHARS_MAX


def _opt_member_id(value) -> bool:
    return value is None or _member_id(value)


def _opt_incarnation(value) -> bool:
    return value is None or _incarnation(value)


def _bind_step(value) -> bool:
    return type(value) is int and 1 <= value <= 3  # peer_binding.STEP_HELLO .. STEP_CONFIRM


def _chunk(value) -> bool:
    # pysyncobj's transmission data: None, or (data, isFirst, isLast) (serializer.py:117-153).
    return value is None or (
        type(value) is tuple and len(value) == 3 and type(value[0]) is bytes
        and len(value[0]) <= raft_limits.RAFT_SNAPSHOT_CHUNK_BYTES
        and type(value[1]) is bool and type(value[2]) is bool
    )


def _entries(value) -> bool:
    # Checked as a whole with the message (_check_append): entries follow prevLogIdx.
    return type(value) is tuple and len(value) <= raft_limits.RAFT_APPEND_ENTRIES_MAX


# kind -> (pysyncobj's message type, fields as (name, check, omitted from the dict when None)).
# Every message pysyncobj 0.3.17 sends between members (syncobj.py:449, 534-569, 643, 940,
# 1090-1107, 1286-1317; transport.py:345, 441, 456), but the split append ("transmission",
# never sent by ours: limits keep every entry below the batch size), "readonly" (no read-only
# members) and utility commands and their answers (not accepted on a member's port).
KIND_KEY = 1  # the secret's key exchange: the sender's random key, bytes
KIND_NAME = 2  # an outgoing connection names its member: the address, str
# Who sends a vote or an acknowledgement (membership.py counts it only if the configuration
# names that incarnation at that address): the sender's cluster id (nil until it knows one)
# and incarnation (identity.py).
_SENDER = (("cluster", _cluster_id, False), ("incarnation", _incarnation, False))
_SCHEMAS: dict[int, tuple[str, tuple[tuple[str, Callable, bool], ...]]] = {
    3: ("request_vote", (("term", _int, False), ("last_log_index", _int, False), ("last_log_term", _int, False),
                         *_SENDER)),
    4: ("response_vote", (("term", _int, False), *_SENDER)),
    5: ("append_entries", (("term", _int, False), ("commit_index", _int, False), ("prevLogIdx", _opt_int, False),
                           ("prevLogTerm", _opt_int, False), ("entries", _entries, False), *_SENDER)),
    6: ("append_entries", (("term", _int, False), ("commit_index", _int, False), ("serialized", _chunk, False),
                           *_SENDER)),
    7: ("next_node_idx", (("next_node_idx", _int, False), ("reset", _bool, False), ("success", _bool, False),
                          *_SENDER)),
    8: ("apply_command", (("command", _is_entry, False), ("request_id", _opt_int, True))),
    9: ("apply_command_response", (("request_id", _int, False), ("log_idx", _int, False), ("log_term", _int, False))),
    10: ("apply_command_response", (("request_id", _int, False), ("error", _fail_code, False))),
    11: ("timeout_now", (("term", _int, False),)),
    # Pre-vote (pre_vote.py): would the receiver grant a vote in ``term``? The answer names the
    # term asked about and the answerer's own, which an asker behind it adopts.
    13: ("pre_vote", (("term", _int, False), ("last_log_index", _int, False), ("last_log_term", _int, False),
                      *_SENDER)),
    14: ("pre_vote_response", (("term", _int, False), ("granted", _bool, False), ("current_term", _int, False),
                               *_SENDER)),
    # A member's answer to an append of a lower term than its own (pre_vote.py): the leader of
    # that term steps down, so an election can reach the member again.
    15: ("term_notice", (("term", _int, False), *_SENDER)),
    # The handshake that binds a connection to both members (peer_binding.py), with the
    # secret: a hello names no receiver's nonce, id or incarnation; a welcome and a confirm
    # name all of them.
    12: ("bind", (("step", _bind_step, False), ("dialler_nonce", _nonce, False), ("receiver_nonce", _opt_nonce, True),
                  ("dialler", _address, False), ("dialler_id", _member_id, False),
                  ("dialler_incarnation", _incarnation, False), ("receiver", _address, False),
                  ("receiver_id", _opt_member_id, True), ("receiver_incarnation", _opt_incarnation, True))),
}
# Trailing fields a frame may leave out altogether (read-index rounds, read_index.py): all of a
# kind's are present or none is, and a message without them is encoded without them, byte for
# byte the frame of a member before them, so members of both versions read each other's
# frames as long as nobody sends them. A member before them refuses a frame that carries
# them (its field count is fixed): RAFT.md "Read-index reads" says when they are sent.
# The leader's appends carry its last read round; a follower's acknowledgement echoes the
# term and round of the append it answers.
_TRAILING: dict[int, tuple[tuple[str, Callable, bool], ...]] = {
    # A candidate standing at its leader's transfer (pre_vote.py): sent only then.
    3: (("transfer", _bool, True),),
    5: (("read_seq", _int, True),),
    6: (("read_seq", _int, True),),
    7: (("read_term", _int, True), ("read_seq", _int, True)),
}
KIND_NAMES = {KIND_KEY: "key", KIND_NAME: "name", **{k: v[0] for k, v in _SCHEMAS.items()}}
_KIND_APPEND, _KIND_SNAPSHOT_CHUNK, _KIND_RESULT, _KIND_ERROR, KIND_BIND = 5, 6, 9, 10, 12
_BIND_RECEIVER_FIELDS = ("receiver_nonce", "receiver_id", "receiver_incarnation")
_KIND_OF_TYPE = {name: kind for kind, (name, _) in _SCHEMAS.items() if kind not in (_KIND_SNAPSHOT_CHUNK, _KIND_ERROR)}
_FIELD_NAMES = {kind: tuple(f[0] for f in fields) for kind, (_, fields) in _SCHEMAS.items()}
_TRAILING_NAMES = {kind: tuple(f[0] for f in fields) for kind, fields in _TRAILING.items()}


def _kind_of(message) -> int:
    if type(message) is dict:
        kind_type = message["type"]
        if kind_type == "append_entries":
            if "transmission" in message:
                raise ValueError("a split append (transmission): members of ours never send one")
            return _KIND_SNAPSHOT_CHUNK if "serialized" in message else _KIND_APPEND
        if kind_type == "apply_command_response" and "error" in message:
            return _KIND_ERROR
        return _KIND_OF_TYPE[kind_type]
    if type(message) is bytes:
        return KIND_KEY
    if type(message) is str:
        return KIND_NAME
    raise ValueError(f"no wire message of type {type(message).__name__}")


def encode_frame(message, key: bytes | None = None) -> bytes:
    """The frame body for ``message`` (what pysyncobj passes to TcpConnection.send).

    Our own messages only: one that fits no schema (a bug here) raises ValueError or
    KeyError rather than go out in a form members refuse.
    """
    kind = _kind_of(message)
    if kind in (KIND_KEY, KIND_NAME):
        return msgpack.packb((WIRE_VERSION, kind, key, message), use_bin_type=True)
    get = message.get
    fields = [get(name) for name in _FIELD_NAMES[kind]]
    trailing = [get(name) for name in _TRAILING_NAMES.get(kind, ())]
    if any(value is not None for value in trailing):
        if any(value is None for value in trailing):
            raise ValueError(f"{message['type']}: {_TRAILING_NAMES[kind]} go together or not at all")
        fields += trailing
    return msgpack.packb((WIRE_VERSION, kind, key, *fields), use_bin_type=True)


# A frame of pysyncobj's own wire is zlib (tcp_connection.py:144): its first byte is 0x78,
# never the first byte of ours (a msgpack array head, 0x9X or 0xdc).
_ZLIB_HEAD = 0x78


def decode_frame(data: bytes, key: bytes | None = None):
    """The message in a frame body: a dict as pysyncobj's handlers read it, the key bytes of
    a key exchange, or the address a connection names itself with.

    ``key``: the key this connection's messages must carry (None before the key exchange or
    without the secret). Raises PeerMessageRefused (LegacyWireFrame for pysyncobj's pickle
    wire) for anything else; nothing is acted on before the whole frame passed.
    """
    if data[:1] == bytes((_ZLIB_HEAD,)):
        raise LegacyWireFrame("a frame of pysyncobj's zlib+pickle wire (a member of a version before the typed wire)")
    try:
        frame = msgpack.unpackb(
            data, use_list=False, raw=False, max_map_len=0, max_ext_len=0,
            max_str_len=raft_limits.RAFT_ADDRESS_CHARS_MAX, max_array_len=raft_limits.RAFT_APPEND_ENTRIES_MAX,
        )
    # msgpack documents that "other exceptions can be raised during unpacking": any type.
    except Exception as exc:  # noqa: BLE001 - a refusal
        raise PeerMessageRefused(f"not one msgpack value within the wire's bounds: {exc}") from None
    if type(frame) is not tuple or len(frame) < 4:
        raise PeerMessageRefused("not a wire frame (an array of version, kind, key, fields)")
    version, kind, frame_key = frame[0], frame[1], frame[2]
    if version != WIRE_VERSION or type(version) is not int:
        raise PeerMessageRefused(f"wire version {version!r}; this member speaks {WIRE_VERSION}")
    if key is None:
        if frame_key is not None:
            raise PeerMessageRefused("a connection key before the key exchange")
    elif type(frame_key) is not bytes or not hmac.compare_digest(frame_key, key):
        raise PeerMessageRefused("a frame under another connection's key")
    fields = frame[3:]
    if type(kind) is not int:  # True == 1: a bool is no kind
        raise PeerMessageRefused(f"a message kind of type {type(kind).__name__}")
    if kind == KIND_KEY or kind == KIND_NAME:
        if len(fields) != 1 or not (is_connection_key if kind == KIND_KEY else _address)(fields[0]):
            raise PeerMessageRefused(f"a malformed {KIND_NAMES[kind]} message")
        return fields[0]
    schema = _SCHEMAS.get(kind)
    if schema is None:
        raise PeerMessageRefused(f"unknown message kind {kind!r}")
    name, spec = schema
    if len(fields) != len(spec):
        trailing = _TRAILING.get(kind, ())
        if not trailing or len(fields) != len(spec) + len(trailing):
            raise PeerMessageRefused(f"{name}: {len(fields)} fields, the schema has {len(spec)}")
        spec = spec + trailing
    message = {"type": name}
    for value, (field, check, optional) in zip(fields, spec, strict=True):
        if not check(value):
            raise PeerMessageRefused(f"{name}: field {field} fails its type or range ({type(value).__name__})")
        if not (optional and value is None):
            message[field] = value
    if kind == _KIND_APPEND:
        _check_append(message)
    elif kind == KIND_BIND:
        # A hello names none of the receiver's part; a welcome and a confirm all of it.
        present = [f in message for f in _BIND_RECEIVER_FIELDS]
        if any(present) if message["step"] == 1 else not all(present):
            raise PeerMessageRefused(f"bind: step {message['step']} with {_BIND_RECEIVER_FIELDS} mismatched")
    return message


def _check_append(message: dict) -> None:
    """An append's entries: typed entries, consecutive after prevLogIdx, terms never above the
    message's and never decreasing (Raft's log matching; pysyncobj adds them as they come)."""
    prev_idx, prev_term, entries = message["prevLogIdx"], message["prevLogTerm"], message["entries"]
    if (prev_idx is None) != (prev_term is None):
        raise PeerMessageRefused("append_entries: prevLogIdx and prevLogTerm must both be set or both nil")
    if prev_idx is None:
        if entries:
            raise PeerMessageRefused("append_entries: entries without a previous index")
        return
    expected, last_term, term = prev_idx + 1, prev_term, message["term"]
    if last_term > term:
        raise PeerMessageRefused("append_entries: prevLogTerm above the message's term")
    for entry in entries:
        if not (
            type(entry) is tuple and len(entry) == 3 and _is_entry(entry[0])
            and entry[1] == expected and type(entry[1]) is int
            and _int(entry[2]) and last_term <= entry[2] <= term
        ):
            raise PeerMessageRefused(f"append_entries: entry {expected - prev_idx} is not a typed entry in sequence")
        expected += 1
        last_term = entry[2]
    if expected >= _INT_END:
        raise PeerMessageRefused("append_entries: indexes past the wire's range")
