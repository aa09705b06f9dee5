"""Issue 14's Raft-port fuzzer: random and mutated frames at every member of real clusters.

Owns: the fuzzer's corpus (mutations of real frames of every message kind built with
``raft_wire.encode_frame``, and random bytes) and its checks. Must never: name a live member
on a connection (that replaces the member's working one: each frame is sent on a fresh
connection in the slot where a member names itself, and a mutation that happens to name a
member is spoiled first), or sleep where it can poll.

Two slots are fuzzed:

- The naming slot, ``FRAMES_PER_MEMBER`` frames at each member in each of three modes: an
  insider (holds the secret, sends the binding handshake's hello, does not know the schema;
  its frames go where the confirm belongs), a stranger at the cluster with the secret (its
  frames meet the handshake) and a stranger at a
  secret-less loopback cluster. Whatever a frame holds, the member must hang up and count it
  (``fencing_raft_refused_peer_messages_total`` grows by exactly the frames that were whole
  or declared an oversized length), keep running, keep its state and keep serving.
- After naming a member that is stopped meanwhile (``FRAMES_AFTER_NAMING_PER_MEMBER`` at each
  live member): here a message that passes the schema reaches Raft, so only frames that
  are wrong by construction are sent (a field of the wrong type or range, another version
  or kind) and each must be refused the same way.

Posing as a member the others dial (the lowest address) found a bug, now fixed in the
transport and kept by ``test_a_member_that_others_dial_cannot_be_named``.

Seeded: the seed is printed and named in every failure; ``RAFT_FUZZ_SEED=<seed>`` replays
the same cases (an insider's frames also carry the member's random connection key).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
import time
import urllib.request
import zlib
from collections import deque

import msgpack
import pysyncobj.pickle as ps_pickle
import pytest
from pysyncobj.encryptor import getEncryptor

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.client import FencingClient
from coordinator.raft import limits as raft_limits
from coordinator.raft import wire as raft_wire
from coordinator.raft.peer_binding import Party, Transcript
from testsupport.grpc_cluster import running_cluster
from testsupport.raft_peer import FloodCounts, RaftPeer, member_party, send_first_frames
from testsupport.supervisor import DEFAULT_HOSTS, pick_ports, wait_until

SECRET = "0123456789abcdef0123456789abcdef-fuzz-test"
# The floor: at least this many frames at each member in each mode.
FRAMES_PER_MEMBER = 10_000
# Frames after naming a stopped member, at each live member and mode: each costs a naming
# and a refusal; enough for every wrong-by-construction family many times over.
FRAMES_AFTER_NAMING_PER_MEMBER = 1_000
# Connections open at once per member: below RAFT_UNNAMED_CONNECTIONS_MAX with room for the
# members' own reconnections, which must never be dropped to admit ours.
CONCURRENCY_PER_MEMBER = raft_limits.RAFT_UNNAMED_CONNECTIONS_MAX - 4
# A member hangs up on a refused frame within a tick. Generous for a loaded 2-core machine,
# yet below the naming deadline: a member that waits for more of a frame it should refuse
# (a head over the bound) is dropped only at that deadline, which the fuzzer must not excuse.
HANG_UP_WITHIN_S = raft_limits.RAFT_NAMING_DEADLINE_MS / 1000 - 1.0
# How often, while frames fly, every member is asked its Status (a read through the log):
# it must answer, with the same epoch.
STATUS_EVERY_S = 1.0
SEED = int(os.environ.get("RAFT_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
RPC_TIMEOUT_S = 5.0


def setup_module() -> None:
    print(f"\nRaft-port fuzzer seed {SEED} (replay: RAFT_FUZZ_SEED={SEED})")


def _cluster(tmp_path_factory, request, name: str, secret: str | None):
    base = tmp_path_factory.mktemp(name)
    metrics_port, _ = pick_ports(DEFAULT_HOSTS)
    node_settings = {i: {"metrics_address": f"{h}:{metrics_port}"} for i, h in enumerate(DEFAULT_HOSTS)}
    settings = {"log_level": "ERROR"}  # tens of thousands of refusals: only the count matters here
    if secret is not None:
        (base / "raft-secret").write_text(secret + "\n")
        settings["raft_secret_file"] = str(base / "raft-secret")
    for cluster in running_cluster(str(base), request, settings=settings, node_settings=node_settings):
        cluster.metrics_urls = [f"http://{h}:{metrics_port}/metrics" for h in DEFAULT_HOSTS]
        yield cluster


@pytest.fixture(scope="module")
def secret_cluster(tmp_path_factory, request):
    yield from _cluster(tmp_path_factory, request, "fuzz-secret", SECRET)


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory, request):
    yield from _cluster(tmp_path_factory, request, "fuzz-open", None)


@pytest.fixture(scope="module")
def encryptor():
    return getEncryptor(SECRET)  # PBKDF2 with 100,000 rounds: once per module


# -- the corpus --------------------------------------------------------------------------------


def real_message(rng: random.Random, addresses: list[str], dicts_only: bool = False):
    """A message of a kind drawn from all the wire has, with values a member could send."""
    term = rng.randrange(1, 2**20)
    idx = rng.randrange(1, 2**20)

    def sender():
        # Votes and acks name their sender's cluster (nil before it has one) and incarnation.
        return {"cluster": rng.choice([None, rng.randbytes(16).hex()]), "incarnation": rng.randrange(1, 2**63)}

    def entries():
        return tuple((raft_wire.encode_entry(rng.randbytes(rng.randrange(0, 64))), idx + 1 + i, term)
                     for i in range(rng.randrange(0, 4)))

    kinds = [
        lambda: {"type": "request_vote", "term": term, "last_log_index": idx, "last_log_term": term, **sender()},
        lambda: {"type": "response_vote", "term": term, **sender()},
        lambda: {"type": "append_entries", "term": term, "commit_index": idx, "prevLogIdx": idx,
                 "prevLogTerm": term, "entries": entries()},
        lambda: {"type": "append_entries", "term": term, "commit_index": idx, "prevLogIdx": None,
                 "prevLogTerm": None, "entries": ()},
        lambda: {"type": "append_entries", "term": term, "commit_index": idx, "serialized": rng.choice(
            [None, (rng.randbytes(rng.randrange(0, 256)), rng.random() < 0.5, True)])},
        lambda: {"type": "next_node_idx", "next_node_idx": idx, "reset": False, "success": True, **sender()},
        lambda: {"type": "apply_command", "command": raft_wire.encode_entry(rng.randbytes(16)), "request_id": idx},
        lambda: {"type": "apply_command", "command": raft_wire.NO_OP_ENTRY},
        lambda: {"type": "apply_command_response", "request_id": idx, "log_idx": idx, "log_term": term},
        lambda: {"type": "apply_command_response", "request_id": idx, "error": rng.randrange(1, 8)},
        lambda: {"type": "timeout_now", "term": term},
    ]
    if not dicts_only:
        kinds += [
            lambda: rng.randbytes(32),  # pysyncobj's key exchange (members refuse it now)
            lambda: rng.choice(addresses),  # a name: sent only spoiled (spoil_names)
            lambda: bind_message(rng, addresses),
        ]
    return rng.choice(kinds)()


def bind_message(rng: random.Random, addresses: list[str]) -> dict:
    """A binding handshake's message of any step (peer_binding.py), under nonces no member
    issued: it can never complete a handshake, whatever a mutation does to it."""
    def party():
        return Party(rng.choice(addresses), rng.choice(["m1", "m2", "m3"]), rng.randrange(1, 2**63))

    hello = Transcript(rng.randbytes(32), party(), rng.choice(addresses))
    return hello.answered(rng.randbytes(32), party()).message(rng.choice([1, 2, 3]))


# Values a type swap puts in place of a field: every msgpack type, and ints out of range.
SWAP_VALUES = [
    1e300, -0.0, math.nan, math.inf, 1.5, -1, -(2**63), 2**63, 2**64 - 1, 0, 7, 2**31,
    "", "7", "x" * 300, b"", b"\x00" * 33, True, False, None, [], [1, 2, 3], [[[]]],
    {}, {"type": "request_vote"}, msgpack.ExtType(5, b"x"), msgpack.Timestamp(1),
]
# msgpack heads that declare far more than follows: bin32, str32, array32, map32, ext32, array16.
HUGE_INNER_HEADS = [b"\xc6\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xdd\xff\xff\xff\xff",
                    b"\xdf\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x05", b"\xdc\xff\xff", b"\xc5\xff\xff"]
# Single bytes that mean much to msgpack: never-used, nil, bools, wide numbers, long heads.
INTERESTING_BYTES = [0xC1, 0xC0, 0xC2, 0xC3, 0xCB, 0xCA, 0xCF, 0xD3, 0xDD, 0xDF, 0xC6, 0xDB, 0xC9,
                     0xD4, 0xD8, 0xFF, 0x7F, 0x90, 0x9F, 0x80, 0x00]
# Frame heads (pysyncobj's signed 32-bit length) a mutation may declare instead of the real one.
HUGE_HEADS = [raft_limits.RAFT_MESSAGE_BYTES_MAX + 1, 2**31 - 1, -1, -(2**31)]


def flip_bits(rng, body):
    out = bytearray(body)
    for _ in range(rng.randrange(1, 9)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def truncate(rng, body):
    return body[: rng.randrange(len(body))] if body else body


def insert_bytes(rng, body):
    at = rng.randrange(len(body) + 1)
    return body[:at] + rng.randbytes(rng.randrange(1, 17)) + body[at:]


def delete_bytes(rng, body):
    at = rng.randrange(len(body) + 1)
    return body[:at] + body[at + rng.randrange(1, 17):]


def interesting_byte(rng, body):
    at = rng.randrange(len(body) + 1)
    return body[:at] + bytes((rng.choice(INTERESTING_BYTES),)) + body[at + 1:]


def huge_inner_length(rng, body):
    at = rng.randrange(len(body) + 1)
    return body[:at] + rng.choice(HUGE_INNER_HEADS) + body[at + rng.randrange(0, 8):]


BYTE_MUTATIONS = [flip_bits, truncate, insert_bytes, delete_bytes, interesting_byte, huge_inner_length]


def type_swap(rng, frame: list) -> list:
    """One value anywhere in the frame (the version, kind, key, a field, or inside one) swapped."""
    frame = list(frame)
    at = rng.randrange(len(frame))
    inner = frame[at]
    if isinstance(inner, (list, tuple)) and inner and rng.random() < 0.5:  # entries, chunks, an entry
        inner = list(inner)
        pick = rng.randrange(len(inner))
        if isinstance(inner[pick], (list, tuple)) and inner[pick] and rng.random() < 0.5:
            entry = list(inner[pick])
            entry[rng.randrange(len(entry))] = rng.choice(SWAP_VALUES)
            inner[pick] = entry
        else:
            inner[pick] = rng.choice(SWAP_VALUES)
        frame[at] = inner
    else:
        frame[at] = rng.choice(SWAP_VALUES)
    return frame


def reshape(rng, frame: list) -> list:
    """The frame's shape changed: a field dropped, added, duplicated, two swapped, or all nested."""
    frame = list(frame)
    how = rng.randrange(5)
    if how == 0 and len(frame) > 1:
        del frame[rng.randrange(len(frame))]
    elif how == 1:
        frame.insert(rng.randrange(len(frame) + 1), rng.choice(SWAP_VALUES))
    elif how == 2:
        frame.append(frame[rng.randrange(len(frame))])
    elif how == 3 and len(frame) > 1:
        a, b = rng.sample(range(len(frame)), 2)
        frame[a], frame[b] = frame[b], frame[a]
    else:
        frame = [frame]
    return frame


def other_header(rng, frame: list) -> list:
    """Another version tag or another message kind (inside the wire's kinds or outside them)."""
    frame = list(frame) + [None] * (2 - len(frame))  # a reshaped frame may have lost them
    if rng.random() < 0.5:
        frame[0] = rng.choice([0, 2, 255, -1, 2**64 - 1, 1.0, True, "1", None, b"\x01"])
    else:
        frame[1] = rng.choice([*range(0, 13), 255, -1, 2**63, 1.0, True, "3", None])
    return frame


STRUCTURAL = [type_swap, type_swap, type_swap, reshape, other_header]


def build_case(case_seed: int, addresses: list[str], wrong_encryptor):
    """A case for send_first_frames' driver: ``case(key)`` -> (body, head or None), deterministic
    in ``case_seed`` but for the member's connection key, which it carries where a frame does."""

    def case(key):
        rng = random.Random(case_seed)
        message = real_message(rng, addresses)
        family = rng.random()
        head = None
        if family < 0.10:  # purely random bytes, some with a start that gets them further
            body = rng.choice([b"", b"\x94", b"\x78", b"\x80\x02"]) + rng.randbytes(rng.randrange(0, 300))
        elif family < 0.14:  # a frame of stock pysyncobj's wire: zlib of a pickle
            body = zlib.compress(ps_pickle.dumps(message), 3)
        elif family < 0.17:  # the right frame under a wrong secret
            body = wrong_encryptor.encrypt(raft_wire.encode_frame(message, key))
        elif family < 0.55:  # a structural change, repacked
            frame = msgpack.unpackb(raft_wire.encode_frame(message, key), use_list=True, raw=False)
            for _ in range(rng.randrange(1, 3)):
                frame = rng.choice(STRUCTURAL)(rng, frame)
            body = msgpack.packb(frame, use_bin_type=True)
        else:  # byte mutations, one to three
            body = raft_wire.encode_frame(message, key)
            for _ in range(rng.randrange(1, 4)):
                body = rng.choice(BYTE_MUTATIONS)(rng, body)
        if rng.random() < 0.08:  # a head that lies: too large, negative, short or long
            head = rng.choice([*HUGE_HEADS, rng.randrange(0, len(body) + 1), len(body) + rng.randrange(1, 1000)])
        return body, head

    return case


def spoil_names(body: bytes, head, key, addresses) -> bytes:
    """``body`` made unable to name a member: a mutation may land on one (a bit flip turning
    one member's address into another's), and naming a live member replaces its connection."""
    first = body if head is None else (body[:head] if 0 <= head <= len(body) else None)
    if first is None:
        return body
    try:
        named = raft_wire.decode_frame(first, key)
    except raft_wire.PeerMessageRefused:
        return body
    if named in addresses and (head is None or head == len(body)):
        return body + b"\x00"  # trailing bytes: msgpack refuses the whole frame
    return body


# -- observation -------------------------------------------------------------------------------


def refusals(cluster) -> dict[int, float]:
    """Each running member's count of refused Raft connections and frames, by index."""
    out = {}
    for node, url in zip(cluster.nodes, cluster.metrics_urls, strict=True):
        if not node.up:
            continue
        with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S) as reply:
            text = reply.read().decode()
        out[node.index] = next(float(line.split()[1]) for line in text.splitlines()
                               if line.startswith("fencing_raft_refused_peer_messages_total "))
    return out


def state_digest(snapshot: bytes) -> str:
    """sha256 of a member's state without its log clock: the read barriers of the Status
    calls this test makes while frames fly move the clock (a barrier is an applied command)."""
    parts = msgpack.unpackb(snapshot, raw=False, strict_map_key=False)
    parts[3] = None  # [magic, version, epoch, log_clock_ms, resources, dedup]
    return hashlib.sha256(msgpack.packb(parts, use_bin_type=True)).hexdigest()


def state(cluster, nodes=None) -> tuple[set, set]:
    """(epochs from Status, each member's state digest) once every asked member agrees."""

    def agreed():
        asked = nodes or cluster.nodes
        epochs = {n.status(RPC_TIMEOUT_S).epoch for n in asked}
        digests = {state_digest(n.admin.Snapshot(pb.SnapshotRequest(local=True), timeout=RPC_TIMEOUT_S).data)
                   for n in asked}
        return (epochs, digests) if len(epochs) == len(digests) == 1 else None

    return wait_until(agreed, 20, what="members to agree on their state")


def serves(cluster, resource: str) -> None:
    """An Acquire, a Write, a Read and a Release. Released, so that no lease of ours expires
    while frames fly: the leader's TICK would end it, and the state would change for a reason
    that is not a frame."""
    with FencingClient(cluster.endpoints) as client:
        lease = client.acquire(resource, holder="fuzz-test", ttl_ms=60_000)
        client.write(resource, "k", b"v", token=lease.token)
        assert client.read(resource, "k").value == b"v"
        client.release(resource, lease.token)


def watcher(cluster, epoch: int, context: str, nodes=None):
    """Called by the driver while frames fly: every member still running and, every
    STATUS_EVERY_S, answering Status with the same epoch."""
    asked_at = [0.0]

    def watch():
        for node in cluster.nodes:
            if node.up:
                node.check_running()
        if time.monotonic() - asked_at[0] >= STATUS_EVERY_S:
            for node in nodes or cluster.nodes:
                got = node.status(RPC_TIMEOUT_S).epoch
                assert got == epoch, f"{context}: {node} epoch {got}, was {epoch}"
            asked_at[0] = time.monotonic()

    return watch


# -- the naming slot ---------------------------------------------------------------------------

MODES = [
    ("insider", "secret_cluster"),  # holds the secret, not the schema
    ("stranger", "secret_cluster"),  # frames meet the secret's handshake
    ("stranger", "open_cluster"),  # a secret-less loopback cluster: frames meet the naming
]


def run_replayable(fuzz, request, who: str, cluster_name: str, encryptor, doing: str) -> None:
    """``fuzz(cluster, who, cluster_name, encryptor, context)``; any failure names the seed."""
    cluster = request.getfixturevalue(cluster_name)
    context = f"seed {SEED}, {who}{doing} at {cluster_name} (replay: RAFT_FUZZ_SEED={SEED})"
    try:
        fuzz(cluster, who, cluster_name, encryptor, context)
    except Exception as exc:  # a member gone, an RPC failed, a wait timed out
        if context in str(exc):
            raise
        raise AssertionError(f"{context}: {exc!r}") from exc


@pytest.mark.parametrize("who, cluster_name", MODES, ids=[f"{w}-{c}" for w, c in MODES])
def test_fuzzed_frames_in_the_naming_slot_are_refused_and_change_nothing(who, cluster_name, request, encryptor):
    run_replayable(fuzz_the_naming_slot, request, who, cluster_name, encryptor, "")


def fuzz_the_naming_slot(cluster, who: str, cluster_name: str, encryptor, context: str) -> None:
    wrong_encryptor = getEncryptor(SECRET + "-wrong")
    addresses = [n.raft_address for n in cluster.nodes]
    cluster.wait_ready()
    serves(cluster, f"fuzz/{who}-{cluster_name}/before")
    refused_before = refusals(cluster)
    sent = {a: FloodCounts() for a in addresses}
    started = time.monotonic()
    halves = 2  # the cluster must serve between them: an Acquire, a Write and a Read
    for half in range(halves):
        (epoch,), digests = state(cluster)

        def shooter(case):
            def shoot(key, frame, confirm):
                body, head = case(key)
                body = spoil_names(body, head, key, addresses)
                return frame(body, head)

            return shoot

        targets = {}
        for node in cluster.nodes:
            rng = random.Random(f"{SEED}/{who}/{cluster_name}/{node.index}/{half}")
            targets[node.raft_address] = deque(
                shooter(build_case(rng.randrange(2**64), addresses, wrong_encryptor))
                for _ in range(FRAMES_PER_MEMBER // halves)
            )
        counts = send_first_frames(
            targets, encryptor=encryptor if who == "insider" else None, concurrency=CONCURRENCY_PER_MEMBER,
            hang_up_within_s=HANG_UP_WITHIN_S, watch=watcher(cluster, epoch, context),
        )
        for address, c in counts.items():
            for field in dataclasses.fields(c):
                setattr(sent[address], field.name, getattr(sent[address], field.name) + getattr(c, field.name))
        for node in cluster.nodes:
            node.check_running()
        assert state(cluster) == ({epoch}, digests), f"{context}: the state changed in half {half}"
        serves(cluster, f"fuzz/{who}-{cluster_name}/{half}")
    elapsed = time.monotonic() - started
    refused_after = refusals(cluster)
    grew = {a: refused_after[i] - refused_before[i] for i, a in enumerate(addresses)}
    print(f"\n{context}: {elapsed:.1f} s")
    for a in addresses:
        c = sent[a]
        print(f"  {a}: {c.connections} frames, each on a connection of its own ({c.bytes_sent} bytes): "
              f"{c.refusable} whole or with an oversized head, {grew[a]:.0f} refusals counted, "
              f"{c.connections - c.refusable} incomplete (ended by an EOF), {c.resets} resets")
    for a in addresses:
        assert sent[a].connections >= FRAMES_PER_MEMBER, context
        assert grew[a] == sent[a].refusable, f"{context}: {a} counted {grew[a]} refusals of {sent[a].refusable}"


# -- after naming a stopped member -------------------------------------------------------------
# Here a frame that passes the schema is acted on by Raft as the named member's, so the
# fuzzer sends only frames wrong by construction, each against its own table of what a field
# must be (written here from the issue, independently of wire.py's checks).

BAD_INTS = [1e300, 1.0, -0.0, math.nan, math.inf, -1, -(2**63), 2**63, 2**64 - 1, "7", b"\x07",
            True, False, None, [3], msgpack.ExtType(1, b"\x07")]
BAD_BOOLS = [0, 1, None, "true", 1.0, b"", []]
BAD_COMMANDS = [300_000_000, 1e300, "text", None, [b"x"], b"", b"\x93\x01\x02\x03", b"\x02\x80",
                b"\x00\x02abc", True]
BAD_VERSIONS = [0, raft_wire.WIRE_VERSION - 1, raft_wire.WIRE_VERSION + 1, 255, -1, 1.0, True, "1", None]
BAD_KINDS = [0, 13, 255, -1, 2**63, 3.0, True, "3", None]
# Message fields that must be an int in [0, 2^63), a bool, or a typed entry, per message.
MUST_BE = {
    "request_vote": {"term": BAD_INTS, "last_log_index": BAD_INTS, "last_log_term": BAD_INTS,
                     "incarnation": BAD_INTS},
    "response_vote": {"term": BAD_INTS, "incarnation": BAD_INTS},
    "append_entries": {"term": BAD_INTS, "commit_index": BAD_INTS},
    "next_node_idx": {"next_node_idx": BAD_INTS, "reset": BAD_BOOLS, "success": BAD_BOOLS},
    "apply_command": {"command": BAD_COMMANDS},
    "apply_command_response": {"request_id": BAD_INTS},
    "timeout_now": {"term": BAD_INTS},
}


def wrong_by_construction(rng: random.Random, addresses: list[str], key) -> bytes:
    message = real_message(rng, addresses, dicts_only=True)
    how = rng.random()
    if how < 0.15:
        frame = msgpack.unpackb(raft_wire.encode_frame(message, key), use_list=True, raw=False)
        frame[0 if how < 0.07 else 1] = rng.choice(BAD_VERSIONS if how < 0.07 else BAD_KINDS)
        return msgpack.packb(frame, use_bin_type=True)
    if how < 0.25 and message["type"] == "append_entries" and message.get("entries"):
        entries = [list(e) for e in message["entries"]]
        entry = rng.choice(entries)
        place = rng.randrange(3)
        entry[place] = rng.choice(BAD_COMMANDS if place == 0 else BAD_INTS)
        return raft_wire.encode_frame({**message, "entries": tuple(tuple(e) for e in entries)}, key)
    field = rng.choice(sorted(MUST_BE[message["type"]]))
    return raft_wire.encode_frame({**message, field: rng.choice(MUST_BE[message["type"]][field])}, key)


AFTER_NAMING_MODES = [("insider", "secret_cluster"), ("stranger", "open_cluster")]


@pytest.mark.parametrize("who, cluster_name", AFTER_NAMING_MODES, ids=[f"{w}-{c}" for w, c in AFTER_NAMING_MODES])
def test_wrong_frames_after_naming_a_stopped_member_are_refused(who, cluster_name, request, encryptor):
    run_replayable(fuzz_after_naming, request, who, cluster_name, encryptor, " naming a stopped member")


def fuzz_after_naming(cluster, who: str, cluster_name: str, encryptor, context: str) -> None:
    addresses = [n.raft_address for n in cluster.nodes]
    cluster.wait_ready()
    # Stopped meanwhile, so the attacker replaces no working connection; the member with the
    # highest address, as it dials the others (pysyncobj: the higher address dials) and so is
    # the one they accept a naming of (test_a_member_that_others_dial_cannot_be_named).
    posed = max(cluster.nodes, key=lambda n: n.raft_address).index
    live = [n for n in cluster.nodes if n.index != posed]
    cluster.stop(posed)
    try:
        (epoch,), digests = state(cluster, live)
        refused_before = refusals(cluster)
        posed_name = cluster.nodes[posed].raft_address
        posed_party = member_party(cluster, posed, asking=live[0].index)  # who the insider's hello names

        def named_case(case_seed: int):
            def case(key, frame, confirm):
                name = confirm or frame(raft_wire.encode_frame(posed_name, key))
                return name + frame(wrong_by_construction(random.Random(case_seed), addresses, key))

            return case

        targets = {}
        for node in live:
            rng = random.Random(f"{SEED}/{who}/{cluster_name}/{node.index}/named")
            targets[node.raft_address] = deque(
                named_case(rng.randrange(2**64)) for _ in range(FRAMES_AFTER_NAMING_PER_MEMBER)
            )
        counts = send_first_frames(
            targets, encryptor=encryptor if who == "insider" else None, concurrency=CONCURRENCY_PER_MEMBER,
            hang_up_within_s=HANG_UP_WITHIN_S, watch=watcher(cluster, epoch, context, live), dialler=posed_party,
        )
        assert state(cluster, live) == ({epoch}, digests), f"{context}: the state changed"
        refused_after = refusals(cluster)
    finally:
        cluster.start(posed)
    cluster.wait_ready()
    serves(cluster, f"fuzz/named-{who}-{cluster_name}")
    state(cluster)  # all three agree again
    print(f"\n{context}:")
    for node in live:
        c = counts[node.raft_address]
        grew = refused_after[node.index] - refused_before[node.index]
        print(f"  {node.raft_address}: {c.connections} frames after naming, {grew:.0f} refusals counted")
        assert grew == c.refusable == c.connections == FRAMES_AFTER_NAMING_PER_MEMBER, context


# -- found by the fuzzer -----------------------------------------------------------------------


@pytest.mark.parametrize("cluster_name", ["secret_cluster", "open_cluster"])
def test_a_member_that_others_dial_cannot_be_named(cluster_name, request):
    """Naming a stopped member at the members that dial it (pysyncobj: the higher address
    dials) put the attacker's connection in place of their outgoing one; once it closed they
    redialled with it and never named themselves, so the member stayed out after its restart
    (with the secret too). Now such a naming is refused, and the member rejoins."""
    cluster = request.getfixturevalue(cluster_name)
    cluster.wait_ready()
    lowest = min(cluster.nodes, key=lambda n: n.raft_address)
    secret = SECRET if cluster_name == "secret_cluster" else None
    refused = {}
    # As the lowest member's handshake names it (with the secret): refused for the direction alone.
    posed = member_party(cluster, lowest.index)
    cluster.stop(lowest.index)
    try:
        for node in cluster.nodes:
            if node is not lowest:
                with RaftPeer(node.raft_address, secret=secret, dialler=posed) as peer:
                    peer.name(lowest.raft_address)
                    refused[node.index] = peer.hung_up(HANG_UP_WITHIN_S)
    finally:
        cluster.start(lowest.index)
    cluster.wait_ready()  # before the fix: the restarted member never answered
    serves(cluster, f"fuzz/dialled-{cluster_name}")
    state(cluster)  # all three agree
    assert all(refused.values()), f"accepted a naming of {lowest}, which they dial: {refused}"
