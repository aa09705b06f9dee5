"""Workload clients and the op recorder.

``Recorder`` runs one client operation through ``FencingClient`` and writes one ``op`` record
(chaos/history.py) per call: invoke/complete from ``time.monotonic_ns()``, outcome ok / refused
(reason) / unknown, token, and what the server reported (applied_index from the response header,
version, hwm, ...). One client call = one record: the client's own retries inside a call keep the
same op_id, so the whole call is one attempt of the logical op.

A call the client tried more than once records its failed attempts as ``attempts``: one line
each, as the client logs it at DEBUG ("Write attempt 1 on A: OutcomeUnknown: ... (retrying)"),
at most ``ATTEMPTS_RECORDED_MAX``, so a refusal that followed a maybe-applied attempt shows
what that attempt met. A call that failed at its only attempt records none: its ``reason``
says it all (in a soak, ~200,000 LeaseHeld answers would otherwise each repeat it). Recorded
only inside ``attempt_log()`` (a chaos client process: its whole life), which makes the client
logger's DEBUG lines for it without changing what any other handler sees.

Classification: a result -> ok; ``NotApplied`` (refusals, Unavailable, Overloaded, invalid) ->
refused (the client promises nothing was applied); ``OutcomeUnknown`` and anything else -> unknown.

Run as a process: ``python -m chaos.workload --process c1 --endpoints A,B,C --out c1.jsonl
--resources r0,r1,r2 --seed 7`` loops acquire / write / keepalive / read / delete / release on a
handful of resources until SIGTERM (finishes the op in flight, then exits 0).

``watch`` mode (``--watch PREFIX``): follow PREFIX's Watch for the whole run, one ``watch``
record per event, resumed across faults (``run_watcher``); chaos.watch_check holds what it saw
to the ops the other clients got acknowledged.

``gc-pause`` mode (``--gc-pause``): acquire ``--resource`` with ``--ttl-ms``, check the lease is
still live (KeepAlive ok), print ``PAUSING token=T`` and SIGSTOP itself — between its lease
check and its write. The harness resumes it after the lease expired and another client acquired
and wrote; it then writes with the old token and prints ``WRITE outcome reason``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

from chaos.history import HistoryWriter
from coordinator.client import FencingClient
from coordinator.client import exceptions as exc_mod

KEYS = ("a", "b")
# Failed attempts recorded per call: the client's own cap is retry_max_attempts (8 here).
ATTEMPTS_RECORDED_MAX = 8


class _AttemptLog(logging.Handler):
    """Collects the client's per-attempt DEBUG lines for the call running on this thread (a
    contention process runs several clients on threads of one process)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.local = threading.local()

    def start(self) -> None:
        self.local.lines = []

    def take(self) -> list[str]:
        lines, self.local.lines = getattr(self.local, "lines", None) or [], None
        return lines

    def emit(self, record: logging.LogRecord) -> None:
        lines = getattr(self.local, "lines", None)
        if lines is not None and len(lines) < ATTEMPTS_RECORDED_MAX and " attempt " in record.getMessage():
            lines.append(record.getMessage())


_attempt_log = _AttemptLog()


class _PassOn(logging.Handler):
    """Passes a client record on to its parent loggers as if the attempt log were not there:
    only at or above the level the client logger had (NOTSET: its parent's level, read at
    each record), so the DEBUG lines it now makes for the attempt log reach no other handler."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logging.DEBUG)
        self.logger, self.level_before = logger, logger.level

    def emit(self, record: logging.LogRecord) -> None:
        parent = self.logger.parent
        if parent is None:
            return
        threshold = self.level_before or parent.getEffectiveLevel()
        if record.levelno >= threshold:
            parent.handle(record)


@contextlib.contextmanager
def attempt_log() -> Iterator[None]:
    """While inside, the client logger makes DEBUG records for the attempt log and passes on
    to its parents only what it passed before: no other logger's or handler's level changes.
    A chaos client process is inside for its whole life; a test only for its own calls."""
    logger = logging.getLogger("coordinator.client")
    before = logger.level, logger.propagate
    pass_on = _PassOn(logger)
    logger.addHandler(pass_on)
    logger.addHandler(_attempt_log)
    logger.propagate = False  # pass_on propagates instead, filtered
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(_attempt_log)
        logger.removeHandler(pass_on)
        logger.setLevel(before[0])
        logger.propagate = before[1]


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", "") or ""
    return reason or type(error).__name__


class Recorder:
    """Runs calls on a FencingClient and records each as one op line."""

    def __init__(self, client: FencingClient, writer: HistoryWriter, process: str):
        self.client = client
        self.writer = writer
        self.process = process
        self.counts: dict[str, int] = {}

    def _record(self, rec: dict[str, Any], after: Callable[[], dict] | None = None) -> None:
        attempts = _attempt_log.take()
        if len(attempts) > 1 or (attempts and attempts[0].endswith("(retrying)")):
            rec["attempts"] = attempts
        if after is not None:
            rec["args"] = {**rec.get("args", {}), **after()}
        self.writer.write(rec)
        self.counts[rec["outcome"]] = self.counts.get(rec["outcome"], 0) + 1

    def call(self, f: str, resource: str, fn: Callable[[bytes], Any], *, key=None, value=None, token=None,
             result_of: Callable[[Any], dict] | None = None, hazard: str | None = None,
             args: dict | None = None, after: Callable[[], dict] | None = None) -> tuple[str, Any]:
        """``after``: called once the call returned or failed, before the record is written;
        what it returns joins ``args`` (state read after the op, for the checker)."""
        op_id = os.urandom(16)
        rec: dict[str, Any] = {
            "type": "op", "process": self.process, "op_id": op_id.hex(), "f": f, "resource": resource,
            "key": key, "value": value, "token": token, "reason": None, "result": {},
        }
        if hazard:
            rec["hazard"] = hazard
        if args:
            rec["args"] = args
        _attempt_log.start()
        rec["invoke_ns"] = time.monotonic_ns()
        try:
            res = fn(op_id)
        except exc_mod.OutcomeUnknown as e:
            rec.update(complete_ns=time.monotonic_ns(), outcome="unknown", reason=_reason(e))
            self._record(rec, after)
            return "unknown", e
        except exc_mod.NotApplied as e:
            rec.update(complete_ns=time.monotonic_ns(), outcome="refused", reason=_reason(e))
            self._record(rec, after)
            return "refused", e
        except Exception as e:  # noqa: BLE001 - anything else: we cannot know
            rec.update(complete_ns=time.monotonic_ns(), outcome="unknown", reason=_reason(e))
            self._record(rec, after)
            return "unknown", e
        rec["complete_ns"] = time.monotonic_ns()
        rec["outcome"] = "ok"
        result = {"applied_index": res.header.applied_index}
        if result_of is not None:
            result.update(result_of(res))
        rec["result"] = result
        self._record(rec, after)
        return "ok", res

    # -- the operations ------------------------------------------------------------------

    def acquire(self, resource: str, ttl_ms: int, holder: str):
        return self.call("acquire", resource,
                         lambda op: self.client.acquire(resource, ttl_ms=ttl_ms, holder=holder, op_id=op),
                         result_of=lambda r: {"token": r.token, "hwm": r.token, "expires_at_ms": r.expires_at_ms})

    def keepalive(self, resource: str, token: int):
        return self.call("keepalive", resource, lambda op: self.client.keep_alive(resource, token=token),
                         token=token, result_of=lambda r: {"token": r.token, "expires_at_ms": r.expires_at_ms})

    def write(self, resource: str, key: str, value: str, token: int, hazard: str | None = None,
              args: dict | None = None, after: Callable[[], dict] | None = None):
        return self.call("write", resource,
                         lambda op: self.client.write(resource, key, value.encode(), token=token, op_id=op),
                         key=key, value=value, token=token, hazard=hazard, args=args, after=after,
                         result_of=lambda r: {"version": r.version, "hwm": r.hwm})

    def delete(self, resource: str, key: str, token: int):
        return self.call("delete", resource, lambda op: self.client.delete(resource, key, token=token, op_id=op),
                         key=key, token=token,
                         result_of=lambda r: {"version": r.version, "deleted": r.deleted})

    def read(self, resource: str, key: str):
        def res(r):
            return {"found": r.found, "value": r.value.decode() if r.found else None,
                    "version": r.version if r.found else 0, "hwm": r.hwm}

        return self.call("read", resource, lambda op: self.client.read(resource, key), key=key, result_of=res)

    def release(self, resource: str, token: int):
        return self.call("release", resource, lambda op: self.client.release(resource, token=token, op_id=op),
                         token=token, result_of=lambda r: {"hwm": r.hwm, "released": r.released})


def make_client(endpoints: list[str], *, timeout_s: float = 4.0) -> FencingClient:
    return FencingClient(endpoints, timeout_s=timeout_s, attempt_timeout_s=1.5, retry_max_attempts=8,
                         retry_backoff_s=0.05, retry_backoff_max_s=0.5)


def run_client(process: str, endpoints: list[str], out: str, resources: list[str], seed: int,
               stop: threading.Event, ttl_ms: int = 2000, think_s: float = 0.02) -> dict[str, int]:
    rng = random.Random(seed)
    seq = 0
    with HistoryWriter(out) as writer, make_client(endpoints) as client:
        rec = Recorder(client, writer, process)
        while not stop.is_set():
            resource = rng.choice(resources)
            if rng.random() < 0.25:
                rec.read(resource, rng.choice(KEYS))
                time.sleep(think_s)
                continue
            outcome, res = rec.acquire(resource, ttl_ms, holder=process)
            if outcome != "ok":
                time.sleep(think_s * 5 if outcome == "refused" else think_s)
                continue
            token = res.token
            for _ in range(rng.randint(1, 4)):
                if stop.is_set():
                    break
                roll = rng.random()
                key = rng.choice(KEYS)
                if roll < 0.6:
                    seq += 1
                    o, _ = rec.write(resource, key, f"{process}-{seq}", token)
                elif roll < 0.7:
                    o, _ = rec.delete(resource, key, token)
                elif roll < 0.85:
                    o, _ = rec.keepalive(resource, token)
                else:
                    o, _ = rec.read(resource, key)
                if o == "refused":
                    break
                time.sleep(think_s)
            rec.release(resource, token)
            time.sleep(think_s)
        return rec.counts


def run_watcher(process: str, endpoints: list[str], out: str, prefix: str, stop: threading.Event) -> int:
    """Watch ``prefix`` until ``stop``, one ``watch`` record per event (chaos/history.py). The
    client resumes the stream across faults itself; if the watch cannot go on (COMPACTED, or
    no member for the client's timeout), it starts again, from the current revision under a new
    stream name after COMPACTED, else from where it was under the same name. Returns the count."""
    seen = 0
    with HistoryWriter(out) as writer, make_client(endpoints, timeout_s=30.0) as client:
        start = 0
        while start == 0 and not stop.is_set():
            try:
                start = client.status(local=True).applied_index + 1
            except exc_mod.FencingError:
                stop.wait(0.5)
        stream, seq, next_revision = 1, 0, start
        while not stop.is_set():
            watcher = client.watch(prefix, start_revision=next_revision)
            closer = threading.Thread(target=lambda w=watcher: (stop.wait(), w.close()), daemon=True)
            closer.start()
            try:
                for event in watcher:
                    seq += 1
                    seen += 1
                    writer.write({
                        "type": "watch", "watcher": f"{process}.{stream}", "prefix": prefix, "start": start,
                        "seq": seq, "revision": event.revision, "event": event.type, "resource": event.resource,
                        "key": event.key or None, "value": event.value.decode() if event.type == "WRITTEN" else None,
                        "token": event.token or None, "t_ns": time.monotonic_ns(),
                    })
            except exc_mod.Compacted as compacted:
                start = next_revision = (compacted.current_revision or 0) + 1
                stream, seq = stream + 1, 0
                continue
            except exc_mod.FencingError:
                stop.wait(0.5)
            next_revision = max(next_revision, watcher.revision + 1)
    return seen


# -- an unfenced store (for the demonstration): a dict behind a TCP line protocol --------------


class UnfencedStore:
    """A tiny key-value store that ignores tokens: what a lease-only client writes to.
    One JSON line per request: {"op": "put", "key": k, "value": v} / {"op": "get", "key": k}."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        import socketserver

        self.data: dict[str, str] = {}
        store = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                for raw in self.rfile:
                    req = json.loads(raw)
                    if req["op"] == "put":
                        store.data[req["key"]] = req["value"]
                        reply = {"ok": True}
                    else:
                        reply = {"ok": True, "value": store.data.get(req["key"])}
                    self.wfile.write((json.dumps(reply) + "\n").encode())

        self.server = socketserver.ThreadingTCPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.address = f"{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_final_states(endpoints: list[str], resources, path: str) -> None:
    """What each resource holds at the end of a run, as ``final_state`` records for the
    checker's durability check (I8): every key's value and version, and the high-water mark."""
    with HistoryWriter(path) as writer, make_client(endpoints, timeout_s=10.0) as client:
        for resource in resources:
            data = {}
            for key in KEYS:
                found = client.read(resource, key)
                if found.found:
                    data[key] = {"value": found.value.decode(), "version": int(found.version)}
            writer.write({"type": "final_state", "resource": resource,
                          "hwm": int(client.describe(resource).hwm), "data": data})


def _unfenced_call(address: str, req: dict) -> dict:
    import socket

    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall((json.dumps(req) + "\n").encode())
        return json.loads(s.makefile().readline())


def unfenced_put(address: str, key: str, value: str) -> None:
    _unfenced_call(address, {"op": "put", "key": key, "value": value})


def unfenced_get(address: str, key: str) -> str | None:
    return _unfenced_call(address, {"op": "get", "key": key}).get("value")


def run_gc_pause(process: str, endpoints: list[str], out: str, resource: str, ttl_ms: int,
                 unfenced: str | None = None) -> int:
    """The client-GC-pause victim (see module docstring)."""
    with HistoryWriter(out) as writer, make_client(endpoints, timeout_s=8.0) as client:
        rec = Recorder(client, writer, process)
        outcome, res = rec.acquire(resource, ttl_ms, holder=process)
        if outcome != "ok":
            print(f"ACQUIRE-FAILED {res!r}", flush=True)
            return 3
        token = res.token
        outcome, _ = rec.keepalive(resource, token)  # the lease check: still ours
        if outcome != "ok":
            print("LEASE-CHECK-FAILED", flush=True)
            return 3
        print(f"PAUSING token={token}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # the "GC pause": right between check and write
        if unfenced:  # a lease-only client: the store never sees the token
            unfenced_put(unfenced, "a", f"{process}-stale")
            print("WRITE ok UNFENCED", flush=True)
            return 0
        outcome, result = rec.write(resource, "a", f"{process}-stale", token)
        reason = getattr(result, "reason", "") if outcome != "ok" else ""
        print(f"WRITE {outcome} {reason}", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.workload")
    p.add_argument("--process", required=True)
    p.add_argument("--endpoints", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resources", default="r0,r1,r2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttl-ms", type=int, default=2000)
    p.add_argument("--gc-pause", action="store_true")
    p.add_argument("--resource", default="gc")
    p.add_argument("--unfenced", default=None, help="host:port of an UnfencedStore (demo)")
    p.add_argument("--watch", default=None, metavar="PREFIX", help="watch PREFIX, recording what it sees")
    args = p.parse_args(argv)
    endpoints = args.endpoints.split(",")
    if args.watch is not None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        seen = run_watcher(args.process, endpoints, args.out, args.watch, stop)
        print(json.dumps({"process": args.process, "watch_events": seen}), flush=True)
        return 0
    if args.gc_pause:
        with attempt_log():
            return run_gc_pause(args.process, endpoints, args.out, args.resource, args.ttl_ms, args.unfenced)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with attempt_log():
        counts = run_client(args.process, endpoints, args.out, args.resources.split(","), args.seed, stop,
                            ttl_ms=args.ttl_ms)
    print(json.dumps({"process": args.process, "counts": counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
