"""Workload roles that exercise the hazards the plain clients barely touch (issue "Deeper
chaos", point 3). One process, ``python -m chaos.hazards --role R``, records into one JSONL
like ``chaos.workload`` does (ops carry ``hazard`` where they exercise one):

``contention``: ``--threads`` clients (each its own channel) on a handful of ``--resources``
    with one key each: they race for the lease (most acquires are LEASE_HELD), the holder writes
    and everybody reads, so a key has many ops in flight and linearizability segments hold
    dozens of ops. Now and then a holder "pauses" past its lease (sleeps ttl + margin between
    its acquire and its write: the server cannot tell a sleep from a GC pause) and then writes
    (``late_holder``): refused if someone took over, accepted if nobody did (I3 only looks at
    the hwm).
    ``--readers`` more threads only read the first resource's key back to back (a read-heavy
    mode): with reads always in flight on it, the writers' writes land inside long runs of
    overlapping reads, so one segment holds dozens of ops (reads of the current value are
    free steps for the search, so this costs the checker little).
``hostile``: writes the server must refuse, on the contended resources, under the same faults:
    a never-issued token (hwm + 1000), a token issued for another resource, a huge token
    (2^63, 2^64-1), and malformed requests (token 0, a 3-byte op_id, a resource name outside
    the alphabet) sent through the raw stubs, past the client's own validation. Each carries a
    fresh value, so a refusal that changed the data shows up as FAILED_WRITE_VISIBLE. One op
    in three goes to a resource only this process touches (``<process>-quiet``), with its hwm
    and key version read before and after: a refusal that moved either is
    REFUSAL_CHANGED_STATE (I3: rejection changes nothing).
``operator``: force-release of a contended resource, epoch floors (fence_all) and a snapshot
    restored with a floor (I7, I11), recording the floor asked for and the backup's data, so
    the checker knows what each did (chaos/check.py, check 6).
Stops on SIGTERM after the op in flight.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time

import grpc

from chaos.history import HistoryWriter
from chaos.workload import Recorder, attempt_log, make_client
from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.api.v1 import fencing_pb2_grpc as pb_grpc
from coordinator.client import exceptions as exc_mod
from coordinator.core.snapshot_format import parse_snapshot

KEY = "a"
# A floor this far above the current epoch: clearly a jump, far below TOKEN_MAX for any run.
FLOOR_GAP = 1000
# A "never issued" token this far above the resource's hwm. Tokens come from one counter that
# every acquire in the cluster moves: hwm + 1000 was reached in a 30-minute soak (about 60
# tokens a second), and an acquire of the same resource was granted exactly that token while
# the hostile write was in flight, so the write was rightly accepted and wrongly reported.
# 2**40 is never reached by a run and still far from the huge-token hazard's 2**63.
NEVER_ISSUED_GAP = 2**40


def contention(rec: Recorder, resources: list[str], rng: random.Random, stop: threading.Event,
               ttl_ms: int, late_every: int) -> None:
    seq = 0
    while not stop.is_set():
        resource = rng.choice(resources)
        if rng.random() < 0.45:
            rec.read(resource, KEY)
            continue
        outcome, res = rec.acquire(resource, ttl_ms, holder=rec.process)
        if outcome != "ok":
            time.sleep(0.01)
            continue
        late = late_every > 0 and rng.randrange(late_every) == 0
        if late:
            stop.wait(ttl_ms / 1000 + 0.4)  # the pause: past the lease, then write as if still holding
        for _ in range(1 if late else rng.randint(1, 3)):
            seq += 1
            o, _ = rec.write(resource, KEY, f"{rec.process}-{seq}", res.token,
                             hazard="late_holder" if late else None)
            if o == "refused":
                break
        rec.read(resource, KEY)
        rec.release(resource, res.token)


def reader(rec: Recorder, resource: str, rng: random.Random, stop: threading.Event, think_s: float) -> None:
    """Reads of one hot key, back to back but for a short random think (contention, above)."""
    while not stop.is_set():
        rec.read(resource, KEY)
        stop.wait(rng.uniform(0, think_s))


class _RawRefusal(exc_mod.NotApplied):
    """The server refused a raw request (any status that promises nothing was applied)."""


_REFUSING_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                   grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                   grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED,
                   grpc.StatusCode.UNAUTHENTICATED}


def _raw_write(rec: Recorder, channels: dict[str, grpc.Channel], resource: str, token: int, value: str,
               hazard: str, *, op_id: bytes | None = None, args: dict | None = None, after=None):
    """A write through the raw stub (no client-side validation), to the leader if known."""
    endpoint = rec.client.leader_endpoint or rec.client.endpoints[0]
    channel = channels.setdefault(endpoint, grpc.insecure_channel(endpoint))
    stub = pb_grpc.FencedStoreStub(channel)

    def send(generated: bytes):
        req = pb.WriteRequest(resource=resource, key=KEY, value=value.encode(), token=token,
                              op_id=op_id if op_id is not None else generated)
        try:
            return stub.Write(req, timeout=2.0)
        except grpc.RpcError as e:
            if e.code() in _REFUSING_CODES:
                raise _RawRefusal(str(e.details()), code=e.code(), reason=e.code().name) from None
            # no answer, or one that promises nothing: the write may still be applied
            raise exc_mod.OutcomeUnknown(str(e.details()), code=e.code(), reason=e.code().name) from None

    return rec.call("write", resource, send, key=KEY, value=value, token=token, hazard=hazard, args=args,
                    after=after, result_of=lambda r: {"version": r.version, "hwm": r.hwm})


HOSTILE_KINDS = ("never_issued", "foreign_token", "huge_token", "malformed")
MALFORMED_SHAPES = ("token_zero", "short_op_id", "bad_resource")


def quiet_resource(process: str) -> str:
    """The resource only this hostile process touches: its refusals there are watched."""
    return f"{process}-quiet"


def _resource_state(rec: Recorder, resource: str) -> dict:
    """hwm of ``resource`` and the version of its key, both read through the log."""
    hwm = int(rec.client.describe(resource).hwm)
    found = rec.client.read(resource, KEY)
    return {"hwm": hwm, "version": int(found.version) if found.found else 0}


def _watch(rec: Recorder, resource: str):
    """``args`` and ``after`` for one op on the quiet resource: its state read before and
    after (chaos/check.py, REFUSAL_CHANGED_STATE); (None, None) if it cannot be read now."""
    started = time.monotonic_ns()
    try:
        before = _resource_state(rec, resource)
    except exc_mod.FencingError:
        return None, None
    # The resource watched: a malformed op may name another (the quiet name made invalid).
    args = {"quiet": resource, "watch_from_ns": started, "hwm_before": before["hwm"],
            "version_before": before["version"]}

    def after() -> dict:
        try:
            now = _resource_state(rec, resource)
        except exc_mod.FencingError:
            return {"watch": "not read after"}  # the checker then has nothing to compare
        return {"hwm_after": now["hwm"], "version_after": now["version"], "watch_to_ns": time.monotonic_ns()}

    return args, after


def hostile_op(rec: Recorder, channels: dict[str, grpc.Channel], kind: str, resource: str, value: str,
               rng: random.Random, *, watch: bool = False) -> str | None:
    """One write of ``kind`` the server must refuse, on ``resource``; its outcome, or None if
    it could not be prepared (no hwm to read, no foreign token). ``watch``: record the
    resource's state before and after it (only where nobody else writes)."""
    args, after = _watch(rec, resource) if watch else (None, None)
    if watch and args is None:
        return None
    if kind == "never_issued":
        try:
            hwm = rec.client.describe(resource).hwm
        except exc_mod.FencingError:
            return None
        return rec.write(resource, KEY, value, int(hwm) + NEVER_ISSUED_GAP, hazard="hostile_never_issued",
                         args=args, after=after)[0]
    if kind == "foreign_token":
        # A real token, issued for another resource: never equal to hwm(resource),
        # since every epoch comes from one counter.
        own = f"{rec.process}-own"
        outcome, res = rec.acquire(own, 5000, holder=rec.process)
        if outcome != "ok":
            return None
        try:
            return rec.write(resource, KEY, value, res.token, hazard="hostile_foreign_token",
                             args=args, after=after)[0]
        finally:
            rec.release(own, res.token)
    if kind == "huge_token":
        return _raw_write(rec, channels, resource, rng.choice([2**63, 2**64 - 1]), value, "hostile_huge_token",
                          args=args, after=after)[0]
    try:
        hwm = int(rec.client.describe(resource).hwm)
    except exc_mod.FencingError:
        return None
    shape = rng.choice(MALFORMED_SHAPES)
    args = {**(args or {}), "shape": shape}
    if shape == "token_zero":
        return _raw_write(rec, channels, resource, 0, value, "hostile_malformed", args=args, after=after)[0]
    if shape == "short_op_id":
        # The current hwm as token: only the op_id is wrong, so only validation stops it.
        return _raw_write(rec, channels, resource, hwm, value, "hostile_malformed", op_id=b"abc",
                          args=args, after=after)[0]
    return _raw_write(rec, channels, resource + " !", hwm, value, "hostile_malformed", args=args, after=after)[0]


def _settle_quiet(rec: Recorder, resource: str, stop: threading.Event) -> bool:
    """Give the quiet resource an hwm and a value, so a refusal that moved either shows."""
    while not stop.is_set():
        outcome, res = rec.acquire(resource, 5000, holder=rec.process)
        if outcome == "ok":
            rec.write(resource, KEY, f"{rec.process}-settled", res.token)
            rec.release(resource, res.token)
            return True
        stop.wait(0.2)
    return False


def hostile(rec: Recorder, resources: list[str], rng: random.Random, stop: threading.Event) -> None:
    channels: dict[str, grpc.Channel] = {}
    quiet = quiet_resource(rec.process)
    seq = 0
    try:
        if not _settle_quiet(rec, quiet, stop):
            return
        while not stop.wait(0.15):
            seq += 1
            # One in three on the quiet resource, watched; the rest where the contention is.
            on_quiet = rng.random() < 1 / 3
            resource = quiet if on_quiet else rng.choice(resources)
            hostile_op(rec, channels, rng.choice(HOSTILE_KINDS), resource, f"{rec.process}-{seq}", rng,
                       watch=on_quiet)
    finally:
        for ch in channels.values():
            ch.close()


def operator(rec: Recorder, resources: list[str], rng: random.Random, stop: threading.Event,
             period_s: float) -> None:
    """Every ``period_s``: a force-release; every 3rd time an epoch floor; every 5th a restore."""
    n = 0
    while not stop.wait(period_s):
        n += 1
        resource = rng.choice(resources)
        rec.call("force_release", resource, lambda op, resource=resource: rec.client.force_release(resource, op_id=op),
                 result_of=lambda r: {"hwm": r.hwm})
        if n % 3 == 0:
            epoch_floor(rec)
        if n % 5 == 0:
            snapshot_restore(rec)


def epoch_floor(rec: Recorder) -> None:
    try:
        floor = int(rec.client.status().epoch) + FLOOR_GAP
    except exc_mod.FencingError:
        return
    rec.call("set_epoch_floor", "*", lambda op: rec.client.set_epoch_floor(floor, fence_all=True),
             args={"floor": floor, "fence_all": True}, result_of=lambda r: {"epoch": r.epoch})


def snapshot_restore(rec: Recorder) -> None:
    """Back up, then restore that backup with a floor above the epoch: the backup's data comes
    back, every resource is fenced, and no token at or below the floor is ever issued (I11)."""
    try:
        snap = rec.client.snapshot()
        floor = int(rec.client.status().epoch) + FLOOR_GAP
    except exc_mod.FencingError:
        return
    parts = parse_snapshot(snap.data, None)
    backup = {name: {key: {"value": value.decode(), "version": int(version)}
                     for key, (value, version) in res.data.items()}
              for name, res in parts.resources.items()}
    rec.call("restore", "*", lambda op: rec.client.restore(snap.data, epoch_floor=floor),
             args={"floor": floor, "backup": backup}, result_of=lambda r: {"epoch": r.epoch})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.hazards")
    p.add_argument("--role", choices=["contention", "hostile", "operator"], required=True)
    p.add_argument("--process", required=True)
    p.add_argument("--endpoints", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resources", default="hot0,hot1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--readers", type=int, default=0, help="contention: threads that only read the first resource")
    # Short enough that some read is nearly always in flight with a few readers, long enough
    # that readers alone do not saturate the two cores the cluster shares with the run.
    p.add_argument("--reader-think-s", type=float, default=0.01, help="contention: readers' longest pause")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttl-ms", type=int, default=1500)
    p.add_argument("--late-every", type=int, default=25, help="contention: one lease in N pauses past its TTL")
    p.add_argument("--period-s", type=float, default=6.0, help="operator: seconds between admin rounds")
    args = p.parse_args(argv)
    endpoints = args.endpoints.split(",")
    resources = args.resources.split(",")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    counts: dict[str, dict] = {}
    with HistoryWriter(args.out) as writer, attempt_log():
        def one(k: int) -> None:
            name = args.process if args.threads == 1 and not args.readers else f"{args.process}.{k}"
            rng = random.Random(args.seed * 1000 + k)
            with make_client(endpoints) as client:
                rec = Recorder(client, writer, name)
                try:
                    if args.role == "contention" and k >= args.threads:
                        reader(rec, resources[0], rng, stop, args.reader_think_s)
                    elif args.role == "contention":
                        contention(rec, resources, rng, stop, args.ttl_ms, args.late_every)
                    elif args.role == "hostile":
                        hostile(rec, resources, rng, stop)
                    else:
                        operator(rec, resources, rng, stop, args.period_s)
                finally:
                    counts[name] = rec.counts

        n = args.threads + (args.readers if args.role == "contention" else 0)
        threads = [threading.Thread(target=one, args=(k,), name=f"hazard-{k}") for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(json.dumps({"process": args.process, "role": args.role, "counts": counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
