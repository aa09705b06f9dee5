"""The binding handshake's checks (coordinator/raft/peer_binding.py), message by message, through
the typed wire as members send them. Real members refusing the same cases (and the relay probe)
are in tests/test_peer_auth.py.

A is dialled (the lower address), C dials it; B is the third member. Each case is what a relay,
a replayer or a reflector holding no secret can make a member read, or what a holder of the
secret posing as another member or incarnation sends: every one is refused, with its reason.
"""

from __future__ import annotations

import os

import pytest

from coordinator.raft import peer_binding as pb
from coordinator.raft import wire as raft_wire
from coordinator.raft.peer_binding import Party, Transcript

A = Party("127.0.0.2:7000", "m1", 11)
B = Party("127.0.0.3:7000", "m2", 22)
C = Party("127.0.0.4:7000", "m3", 33)


def wire(message: dict, key: bytes | None = None):
    """``message`` as the receiving member decodes it (typed wire, the connection's key)."""
    return raft_wire.decode_frame(raft_wire.encode_frame(message, key), key)


def handshake(dialler: Party = C, receiver: Party = A) -> tuple[Transcript, Transcript]:
    hello = Transcript(os.urandom(pb.NONCE_BYTES), dialler, receiver.address)
    return hello, hello.answered(os.urandom(pb.NONCE_BYTES), receiver)


def test_a_whole_handshake_binds_both_members():
    hello, welcomed = handshake()
    got, refusal = pb.check_hello(wire(hello.message(pb.STEP_HELLO)), A.address)
    assert refusal is None and got == hello
    bound, refusal = pb.check_welcome(wire(welcomed.message(pb.STEP_WELCOME), hello.dialler_nonce), hello, A.member_id)
    assert refusal is None and bound == welcomed and bound.receiver == A
    assert pb.check_confirm(wire(welcomed.message(pb.STEP_CONFIRM), welcomed.receiver_nonce), welcomed) is None


def test_a_hello_for_another_member_is_refused_by_the_one_it_reached():
    """The relay: C dialled B's address; the relay handed the hello to A."""
    hello, _ = handshake(receiver=B)
    got, refusal = pb.check_hello(wire(hello.message(pb.STEP_HELLO)), A.address)
    assert got is None and refusal.reason == pb.MISDIALLED


@pytest.mark.parametrize("answerer, expected_id", [(B, None), (Party(A.address, "m9", 11), "m1")],
                         ids=["another-address", "another-member-id"])
def test_a_welcome_from_another_than_the_member_dialled_is_refused(answerer, expected_id):
    """The dialling side: C dialled A and the answer is from B (relayed), or from a member id
    the configuration does not give A's address."""
    hello = Transcript(os.urandom(pb.NONCE_BYTES), C, A.address)
    welcome = hello.answered(os.urandom(pb.NONCE_BYTES), answerer).message(pb.STEP_WELCOME)
    welcome["receiver"] = answerer.address  # what the answerer says of itself
    bound, refusal = pb.check_welcome(wire(welcome, hello.dialler_nonce), hello, expected_id)
    assert bound is None and refusal.reason == pb.MISDIALLED


@pytest.mark.parametrize("step", [pb.STEP_WELCOME, pb.STEP_CONFIRM])
def test_a_reflected_handshake_is_refused(step):
    """A message of the other direction where a hello belongs, and the receiver's own welcome
    sent back to it where the confirm belongs."""
    hello, welcomed = handshake()
    _, refusal = pb.check_hello(wire(welcomed.message(step), None), A.address)
    assert refusal.reason == pb.NOT_A_HANDSHAKE
    refusal = pb.check_confirm(wire(welcomed.message(pb.STEP_WELCOME), welcomed.receiver_nonce), welcomed)
    assert refusal.reason == pb.NOT_A_HANDSHAKE
    _, refusal = pb.check_welcome(wire(hello.message(pb.STEP_HELLO), None), hello, None)
    assert refusal.reason == pb.NOT_A_HANDSHAKE


def test_replayed_nonces_are_refused():
    """A welcome or a confirm of an earlier handshake between the same members."""
    old_hello, old_welcomed = handshake()
    hello, welcomed = handshake()
    _, refusal = pb.check_welcome(wire(old_welcomed.message(pb.STEP_WELCOME)), hello, A.member_id)
    assert refusal.reason == pb.REPLAYED
    assert pb.check_confirm(wire(old_welcomed.message(pb.STEP_CONFIRM)), welcomed).reason == pb.REPLAYED
    # The old confirm's frame, under the old connection's key, does not even decode here.
    with pytest.raises(raft_wire.PeerMessageRefused):
        raft_wire.decode_frame(
            raft_wire.encode_frame(old_welcomed.message(pb.STEP_CONFIRM), old_welcomed.receiver_nonce),
            welcomed.receiver_nonce,
        )


@pytest.mark.parametrize("field", ["dialler_incarnation", "receiver_incarnation"])
def test_a_confirm_naming_another_incarnation_than_the_handshake_is_refused(field):
    _, welcomed = handshake()
    confirm = welcomed.message(pb.STEP_CONFIRM)
    confirm[field] += 1
    assert pb.check_confirm(wire(confirm), welcomed).reason == pb.REPLAYED


def test_a_welcome_naming_another_incarnation_of_the_dialler_is_refused():
    hello, welcomed = handshake()
    welcome = welcomed.message(pb.STEP_WELCOME)
    welcome["dialler_incarnation"] += 1
    _, refusal = pb.check_welcome(wire(welcome), hello, A.member_id)
    assert refusal.reason == pb.REPLAYED


@pytest.mark.parametrize("step, drop", [(1, None), (2, "receiver_nonce"), (3, "receiver_incarnation")])
def test_the_wire_refuses_a_bind_message_with_the_receivers_part_half_there(step, drop):
    _, welcomed = handshake()
    message = welcomed.message(step if step != 1 else pb.STEP_WELCOME)
    message["step"] = step
    if drop:
        message[drop] = None
    with pytest.raises(raft_wire.PeerMessageRefused):
        wire(message)
