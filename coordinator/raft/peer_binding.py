"""The handshake that binds a Raft connection to the member who dialled and the member dialled.

Owns: ``Party`` (a member as the handshake names it: Raft address, member id, incarnation),
``Transcript`` (what one handshake has bound so far) with its three messages (hello, welcome,
confirm: the typed wire's "bind" kind, ``wire.KIND_BIND``) and the checks each side makes of
what it receives (``check_hello``, ``check_welcome``, ``check_confirm``), each returning why a
message is refused, or None. RAFT.md and SECURITY.md "Peer authentication".

With the peer secret every frame is a Fernet token (AES-CBC + HMAC-SHA256 under a key derived
from the secret), so what a message says is bound to the secret. The secret proves "holds
the secret", not "who": a relay on a stopped member's address forwarded one member's dial to
another, which took it for a reconnection (issue 26). So each message carries the whole
transcript so far: the dialler's nonce, the receiver's nonce (from the welcome on), the step
(which says the direction: a hello and a confirm go dialler -> receiver, a welcome back), and
both members' address, id and incarnation; the frame key (wire.decode_frame) is the nonce of
the side that reads it. A relayed, replayed or reflected message names another address,
another nonce or another step, and is refused.
Must never: import pysyncobj, or accept a message whose step, nonces or members differ from
the transcript so far.
"""

from __future__ import annotations

import dataclasses
import hmac
from typing import NamedTuple

STEP_HELLO, STEP_WELCOME, STEP_CONFIRM = 1, 2, 3
NONCE_BYTES = 32  # as pysyncobj's connection keys (os.urandom(32), transport.py:344, 455)
BIND_TYPE = "bind"


# Why a handshake message is refused, as counted per reason (metrics: refused_bindings).
NOT_A_HANDSHAKE = "not_a_handshake"  # not a bind message, or another step (reflected, out of order)
MISDIALLED = "misdialled"  # meant for another member, or answered by another than the one dialled
REPLAYED = "replayed"  # nonces or members of another handshake


class Refusal(NamedTuple):
    reason: str  # one of the constants above (or the transport's own)
    why: str  # for the log line


@dataclasses.dataclass(frozen=True)
class Party:
    """A member as a handshake names it."""

    address: str  # its raft_address, as the configuration and the dialler name it
    member_id: str
    incarnation: int


@dataclasses.dataclass(frozen=True)
class Transcript:
    """One handshake: the dialler's hello, then the receiver's part once it answered."""

    dialler_nonce: bytes
    dialler: Party
    target: str  # the address the dialler dialled
    receiver_nonce: bytes | None = None
    receiver: Party | None = None  # its address is ``target`` (check_welcome)

    def message(self, step: int) -> dict:
        """The wire message of ``step`` for this transcript (a hello before the receiver's part)."""
        message = {
            "type": BIND_TYPE, "step": step, "dialler_nonce": self.dialler_nonce,
            "dialler": self.dialler.address, "dialler_id": self.dialler.member_id,
            "dialler_incarnation": self.dialler.incarnation, "receiver": self.target,
        }
        if step != STEP_HELLO:
            assert self.receiver is not None  # named by the welcome, the step after the hello
            message.update(receiver_nonce=self.receiver_nonce, receiver_id=self.receiver.member_id,
                           receiver_incarnation=self.receiver.incarnation)
        return message

    def answered(self, receiver_nonce: bytes, receiver: Party) -> Transcript:
        return dataclasses.replace(self, receiver_nonce=receiver_nonce, receiver=receiver)


def _bind(message, step: int) -> Refusal | None:
    if type(message) is not dict or message.get("type") != BIND_TYPE:
        kind = message.get("type") if type(message) is dict else type(message).__name__
        return Refusal(NOT_A_HANDSHAKE, f"a {kind} where the handshake's step {step} belongs")
    if message["step"] != step:
        return Refusal(NOT_A_HANDSHAKE, f"step {message['step']} where step {step} belongs (reflected or out of order)")
    return None


def _same(a: bytes | None, b: bytes | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a, b)


def check_hello(message, own_address: str) -> tuple[Transcript | None, Refusal | None]:
    """A hello a receiver at ``own_address`` got: (its transcript, None) or (None, why refused)."""
    why = _bind(message, STEP_HELLO)
    if why:
        return None, why
    if message["receiver"] != own_address:
        return None, Refusal(
            MISDIALLED, f"it dialled {message['receiver']}, not this member ({own_address}): relayed or misrouted"
        )
    dialler = Party(message["dialler"], message["dialler_id"], message["dialler_incarnation"])
    return Transcript(message["dialler_nonce"], dialler, message["receiver"]), None


def check_welcome(message, sent: Transcript, expected_id: str | None) -> tuple[Transcript | None, Refusal | None]:
    """The receiver's welcome to the hello of ``sent``: it must echo the hello and be the member
    dialled (its address; its member id when the configuration names one, ``expected_id``)."""
    why = _bind(message, STEP_WELCOME)
    if why:
        return None, why
    receiver = Party(message["receiver"], message["receiver_id"], message["receiver_incarnation"])
    if receiver.address != sent.target:
        return None, Refusal(
            MISDIALLED, f"it is {receiver.address}, not {sent.target}, which this member dialled: relayed or misrouted"
        )
    if expected_id is not None and receiver.member_id != expected_id:
        return None, Refusal(
            MISDIALLED, f"it is member {receiver.member_id}; the configuration names {expected_id} at {sent.target}"
        )
    if not _same(message["dialler_nonce"], sent.dialler_nonce) or _dialler(message) != sent.dialler:
        return None, Refusal(REPLAYED, "it answers another hello (a replayed welcome)")
    return sent.answered(message["receiver_nonce"], receiver), None


def check_confirm(message, welcomed: Transcript) -> Refusal | None:
    """The dialler's confirm of the welcome a receiver sent (``welcomed``): the whole transcript again."""
    why = _bind(message, STEP_CONFIRM)
    if why:
        return why
    if not (_same(message["dialler_nonce"], welcomed.dialler_nonce)
            and _same(message["receiver_nonce"], welcomed.receiver_nonce)):
        return Refusal(REPLAYED, "it confirms another handshake's nonces (a replayed confirm)")
    assert welcomed.receiver is not None  # a welcomed transcript names its receiver
    if _dialler(message) != welcomed.dialler or message["receiver"] != welcomed.target or (
        message["receiver_id"], message["receiver_incarnation"]
    ) != (welcomed.receiver.member_id, welcomed.receiver.incarnation):
        return Refusal(REPLAYED, "it names other members than its hello and the welcome")
    return None


def _dialler(message: dict) -> Party:
    return Party(message["dialler"], message["dialler_id"], message["dialler_incarnation"])
