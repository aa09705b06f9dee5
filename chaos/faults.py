"""Faults: small composable objects with ``inject(cluster)`` / ``heal(cluster)``.

Every fault records which nodes it touched (``self.nodes``, Raft addresses) and whether it hit
the leader (``leader_fault``: the runner then measures failover time). Network faults are nft
rules in the table ``inet chaos`` on node-to-node Raft traffic only (``ip saddr NODE ip daddr NODE
tcp dport|sport RAFT_PORT``);
clients connect from 127.0.0.1 and still reach every node, so a partitioned node answers clients
(NO_LEADER / forwarding paths). Heal of a network fault deletes the table (one network fault at a
time). The harness teardown deletes it too, whatever happened.
"""

from __future__ import annotations

import itertools
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

from chaos.harness import NFT_TABLE, ChaosCluster, run_quiet
from coordinator.core.names import ErrorReason
from coordinator.raft import limits as raft_limits
from coordinator.raft.journal import JOURNAL_NAME, SYNCED_SIDECAR_SUFFIX
from testsupport.supervisor import wait_until

# -- nft helpers -------------------------------------------------------------------------


def nft(*args: str) -> None:
    r = run_quiet(["nft", *args])
    if r.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {r.stderr.strip()}")


def nft_ensure_input_chain() -> None:
    nft("add", "table", "inet", NFT_TABLE)
    nft("add", "chain", "inet", NFT_TABLE, "input", "{ type filter hook input priority 0 ; }")


def nft_drop(src: str, dst: str, port: int | None = None, extra: str = "") -> None:
    """Drop packets from ``src`` to ``dst``; with ``port``, only the Raft traffic of that port
    (either direction of the TCP connection: dport for requests, sport for answers), so another
    cluster using the same addresses on other ports is not touched."""
    nft_ensure_input_chain()
    base = ["add", "rule", "inet", NFT_TABLE, "input", "ip", "saddr", src, "ip", "daddr", dst]
    tails = [["tcp", "dport", str(port)], ["tcp", "sport", str(port)]] if port else [[]]
    for tail in tails:
        nft(*base, *tail, *(extra.split() if extra else []), "drop")


def nft_heal() -> None:
    run_quiet(["nft", "delete", "table", "inet", NFT_TABLE])


def nft_table_exists() -> bool:
    return run_quiet(["nft", "list", "table", "inet", NFT_TABLE]).returncode == 0


# -- base -----------------------------------------------------------------------------------


class Fault:
    kind = "fault"
    leader_fault = False
    network = False
    #: for the report: True when nothing is expected to serve during the fault (no quorum)
    no_quorum = False
    #: a fault that checks something itself sets info["ok"] by heal; this says what False
    #: means, and the run records it as an error (None: the fault checks nothing)
    failure: str | None = None
    #: a hard bound on the whole step (inject, hold, heal, convergence), in seconds: past it
    #: the runner tears the run down and exits 3, naming the fault (None: only the run's budget)
    timeout_s: float | None = None
    #: a fault on followers only: the leader must lead through it in the same term (pre-vote,
    #: RAFT.md "Pre-vote"); the run records an error if the leader or the term moved
    keeps_leader = False

    def __init__(self) -> None:
        self.nodes: list[str] = []
        self.info: dict = {}

    def inject(self, c: ChaosCluster) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def heal(self, c: ChaosCluster) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind})"


def _pick(c: ChaosCluster, role: str, rng: random.Random | None = None) -> int:
    leader = c.wait_leader()
    if role == "leader":
        return leader
    followers = [n.index for n in c.nodes if n.index != leader]
    return (rng or random).choice(followers)


class Pause(Fault):
    """SIGSTOP the leader or a follower; heal: SIGCONT."""

    def __init__(self, role: str = "leader") -> None:
        super().__init__()
        self.role = role
        self.kind = f"pause_{role}"
        self.leader_fault = role == "leader"
        self.keeps_leader = role == "follower"
        self.i = -1

    def inject(self, c):
        self.i = _pick(c, self.role)
        self.nodes = [c.nodes[self.i].raft_address]
        c.pause(self.i)

    def heal(self, c):
        c.resume(self.i)


class KillRestart(Fault):
    """kill -9 one node (leader or follower); heal: restart it on the same data dir."""

    def __init__(self, role: str = "leader") -> None:
        super().__init__()
        self.role = role
        self.kind = f"kill_{role}"
        self.leader_fault = role == "leader"
        self.keeps_leader = role == "follower"
        self.i = -1

    def inject(self, c):
        self.i = _pick(c, self.role)
        self.nodes = [c.nodes[self.i].raft_address]
        c.kill(self.i)

    def heal(self, c):
        c.start(self.i)


class KillTwo(Fault):
    """kill -9 the leader and the most up-to-date follower while the third node is paused;
    heal: restart both, resume the third. No quorum during the fault."""

    kind = "kill_two_pause_third"
    no_quorum = True

    def inject(self, c):
        leader = c.wait_leader()
        follower = c.most_up_to_date_follower(leader)
        third = next(n.index for n in c.nodes if n.index not in (leader, follower))
        self.killed, self.third = [leader, follower], third
        self.nodes = [c.nodes[i].raft_address for i in (leader, follower, third)]
        c.pause(third)
        for i in self.killed:
            c.kill(i)

    def heal(self, c):
        for i in self.killed:
            c.start(i)
        c.resume(self.third)


class FullRestart(Fault):
    """kill -9 every node; heal: start them all again."""

    kind = "full_restart"
    no_quorum = True

    def inject(self, c):
        self.nodes = [n.raft_address for n in c.nodes]
        for n in c.nodes:
            c.kill(n.index)

    def heal(self, c):
        for n in c.nodes:
            c.start(n.index)


class PowerLoss(Fault):
    """kill -9 and cut the journal to its synced length (``scope``: leader or all); heal: start.

    A cut only bites if the victim has unsynced journal bytes at the moment it dies, and right
    after a group-commit sync it has none. So before the kill, for up to ``watch_s`` while the
    workload runs, the victims' journal size is compared (from outside, every ``poll_s``) with
    the synced length in the ``raft.journal.synced`` sidecar; a victim seen with size > synced is
    SIGSTOPped, and once every one of its threads is stopped the two are read again: still
    size > synced -> it stays frozen until the kill (SIGKILL with no SIGCONT in between, so not
    one more byte is synced and the cut is guaranteed to drop something); otherwise it is
    resumed and the watch goes on. A victim never caught within the window is killed anyway
    (it may then lose 0 bytes; ``info["power_loss"][node]["caught"]`` is False).

    ``info["bytes_cut"]``: bytes cut per node (Raft address); ``info["power_loss"]``: per node,
    whether it was caught with unsynced bytes, how many, after how long, journal lengths.
    """

    def __init__(self, scope: str = "leader", watch_s: float = 2.0, poll_s: float = 0.001) -> None:
        super().__init__()
        self.scope = scope
        self.kind = f"power_loss_{scope}"
        self.leader_fault = scope == "leader"
        self.no_quorum = scope == "all"
        self.indexes: list[int] = []
        self.watch_s = watch_s
        self.poll_s = poll_s

    def inject(self, c):
        self.indexes = [c.wait_leader()] if self.scope == "leader" else [n.index for n in c.nodes]
        self.nodes = [c.nodes[i].raft_address for i in self.indexes]
        t0 = time.monotonic()
        try:
            watch = _catch_unsynced(c, self.indexes, self.watch_s, self.poll_s)
        except Exception as exc:  # noqa: BLE001 - the power loss itself must still happen
            watch = {}
            self.info["watch_error"] = repr(exc)
        self.info["watch_s"] = round(time.monotonic() - t0, 3)
        cuts, details = {}, {}
        for i in self.indexes:
            node = c.nodes[i]
            d = watch.get(i, {"caught": False})
            # c.power_loss SIGKILLs with no SIGCONT first: a frozen node cannot sync in between.
            old, new = c.power_loss(i)
            cuts[node.raft_address] = old - new
            details[node.raft_address] = {**d, "journal_len": old, "synced_len": new, "bytes_cut": old - new}
        self.info["bytes_cut"] = cuts
        self.info["power_loss"] = details

    def heal(self, c):
        for i in self.indexes:
            c.start(i)


def journal_lengths(data_dir: str) -> tuple[int, int] | None:
    """(journal file size, synced length from the sidecar), read from outside the node process;
    None if either file is missing or the sidecar is short."""
    path = os.path.join(data_dir, JOURNAL_NAME)
    try:
        with open(path + SYNCED_SIDECAR_SUFFIX, "rb") as f:
            raw = f.read(8)
        size = os.stat(path).st_size
    except OSError:
        return None
    if len(raw) != 8:
        return None
    return size, struct.unpack("<Q", raw)[0]


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (T) or gone: none can run, hence none can write.
    A thread inside a syscall (fdatasync, pwrite) finishes it before it stops."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # the process is gone
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread exited
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def _freeze(c: ChaosCluster, i: int, timeout_s: float = 1.0) -> bool:
    """SIGSTOP node ``i`` (``c.pause``: teardown SIGCONTs it whatever happens) and wait until
    every thread is stopped. False if that was not confirmed within ``timeout_s``."""
    c.pause(i)
    pid = c.nodes[i].proc.pid
    try:
        # A fine poll: the sooner the freeze is confirmed, the likelier the bytes are still unsynced.
        wait_until(lambda: _all_threads_stopped(pid), timeout_s, interval_s=0.0002, what=f"node {i} to stop")
    except TimeoutError:
        return False
    return True


def _catch_unsynced(c: ChaosCluster, indexes: list[int], window_s: float, poll_s: float) -> dict[int, dict]:
    """Freeze each node of ``indexes`` at a moment its journal has unsynced bytes (see
    ``PowerLoss``). Returns per index: caught (frozen with unsynced bytes), unsynced_bytes,
    after_s, freeze_attempts. Nodes not caught are left running."""
    t0 = time.monotonic()
    deadline = t0 + window_s
    pending = list(indexes)
    attempts = {i: 0 for i in indexes}
    out: dict[int, dict] = {}
    while pending and time.monotonic() < deadline:
        for i in list(pending):
            node = c.nodes[i]
            if not node.alive or node.paused:
                pending.remove(i)
                out[i] = {"caught": False, "why": "not running" if not node.alive else "already paused"}
                continue
            lengths = journal_lengths(node.data_dir)
            if lengths is None or lengths[0] <= lengths[1]:
                continue
            attempts[i] += 1
            stopped = _freeze(c, i)
            lengths = journal_lengths(node.data_dir)
            if stopped and lengths is not None and lengths[0] > lengths[1]:
                pending.remove(i)
                out[i] = {"caught": True, "unsynced_bytes": lengths[0] - lengths[1],
                          "after_s": round(time.monotonic() - t0, 4), "freeze_attempts": attempts[i]}
            else:
                c.resume(i)  # synced in between (or not confirmed stopped): watch on
        time.sleep(poll_s)
    for i in pending:
        out[i] = {"caught": False, "why": f"no unsynced bytes seen within {window_s} s",
                  "freeze_attempts": attempts[i]}
    return out



class Partition(Fault):
    """Symmetric partition: ``side`` (node indexes) cannot talk to the rest, both directions.

    role ``follower``: one follower cut off (majority keeps serving);
    role ``leader``: leader isolation (majority elects a new leader; the old one steps down);
    role ``bridge``: two followers cannot talk to each other, both still reach the leader."""

    network = True

    def __init__(self, role: str = "follower") -> None:
        super().__init__()
        self.role = role
        self.kind = {"leader": "isolate_leader", "follower": "partition_follower", "bridge": "partition_bridge"}[role]
        self.leader_fault = role == "leader"
        self.keeps_leader = role in ("follower", "bridge")

    def inject(self, c):
        leader = c.wait_leader()
        if self.role == "bridge":
            a, b = [n for n in c.nodes if n.index != leader]
            pairs = [(a, b)]
        else:
            i = leader if self.role == "leader" else _pick(c, "follower")
            pairs = [(c.nodes[i], n) for n in c.nodes if n.index != i]
        self.nodes = sorted({x.raft_address for p in pairs for x in p})
        for x, y in pairs:
            nft_drop(x.host, y.host, c.raft_port)
            nft_drop(y.host, x.host, c.raft_port)

    def heal(self, c):
        nft_heal()


class OneWay(Fault):
    """One-way partition: packets from the leader to the followers are dropped; the followers'
    packets still reach the leader."""

    kind = "one_way_leader_out"
    network = True
    leader_fault = True

    def inject(self, c):
        leader = c.nodes[c.wait_leader()]
        self.nodes = [leader.raft_address]
        for n in c.nodes:
            if n is not leader:
                nft_drop(leader.host, n.host, c.raft_port)

    def heal(self, c):
        nft_heal()


class PacketLoss(Fault):
    """Random loss of ``percent``% of node-to-node packets (nft numgen)."""

    network = True

    def __init__(self, percent: int = 30) -> None:
        super().__init__()
        self.percent = percent
        self.kind = f"packet_loss_{percent}"

    def inject(self, c):
        self.nodes = [n.raft_address for n in c.nodes]
        for a in c.nodes:
            for b in c.nodes:
                if a is not b:
                    extra = "" if self.percent >= 100 else f"numgen random mod 100 < {self.percent}"
                    nft_drop(a.host, b.host, c.raft_port, extra)

    def heal(self, c):
        nft_heal()


class Delay(Fault):
    """Delay node-to-node packets by ``ms`` ± ``jitter_ms`` (NFQUEUE + chaos.nfqueue_delay)."""

    network = True

    def __init__(self, ms: int = 100, jitter_ms: int = 20) -> None:
        super().__init__()
        self.ms, self.jitter_ms = ms, jitter_ms
        self.kind = f"delay_{ms}ms"
        self.proc: subprocess.Popen | None = None

    def inject(self, c):
        from chaos import nfqueue_delay

        self.nodes = [n.raft_address for n in c.nodes]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chaos.nfqueue_delay", "--delay-ms", str(self.ms),
             "--jitter-ms", str(self.jitter_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        c.adopt(self.proc.pid)
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline() if ready else ""
        if "READY" not in line:
            self.proc.kill()
            raise RuntimeError(f"delayer did not start: {line!r}")
        pairs = [(a.host, b.host) for a in c.nodes for b in c.nodes if a is not b]
        nfqueue_delay.add_rules(pairs, c.raft_port)

    def heal(self, c):
        from chaos import nfqueue_delay

        nfqueue_delay.remove_rules()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        nft_heal()


# -- a stranger at the Raft ports ---------------------------------------------------------


def hung_up_on(sock: socket.socket, timeout_s: float) -> bool:
    """True once the peer closed ``sock`` (EOF or reset) within ``timeout_s``, False if it
    kept it open that long. Anything the peer sends meanwhile is read and discarded."""
    deadline = time.monotonic() + timeout_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(4096):
                return True
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (socket.timeout, OSError):
        return False


class RaftStranger(Fault):
    """Someone else at every member's Raft port while the workload runs (RAFT.md, "Bounded
    frames", "Connections that name no member"): more idle connections than members keep
    waiting, frames declaring 2 GiB, a deflated frame that inflates past the frame bound, and
    garbage, over and over until heal. Each hostile connection must be hung up on, and the
    members must go on serving (the history check and convergence show that)."""

    kind = "raft_stranger"
    failure = "a member kept a hostile connection open"
    IDLE_PER_MEMBER = 24  # above raft_limits.RAFT_UNNAMED_CONNECTIONS_MAX (16)
    HANG_UP_WITHIN_S = 3.0  # each payload is refused as soon as it is read

    def __init__(self) -> None:
        super().__init__()
        self._stop = threading.Event()
        self._idle: list[socket.socket] = []
        self._thread: threading.Thread | None = None
        self.counts = {"hostile": 0, "hung_up": 0, "kept_open": 0, "connect_failed": 0}

    def inject(self, c):
        # The idle connections and a first round before inject returns, so the fault's hold
        # time is all harassment, whatever the listener's queue (stock pysyncobj: 5
        # connections, beyond which connects waited on SYN retransmits of 1 s, then 3 s).
        self.nodes = [n.raft_address for n in c.nodes]
        bomb = zlib.compress(b"\0" * (raft_limits.RAFT_MESSAGE_BYTES_MAX + 1024), 9)
        self._payloads = [
            struct.pack("i", 2**31 - 1),  # a head declaring 2 GiB, no body
            struct.pack("i", len(bomb)) + bomb,  # ~32 KiB that inflates past the bound
            struct.pack("i", 508) + os.urandom(508),  # a whole frame of garbage
        ]
        for address in self.nodes:
            for _ in range(self.IDLE_PER_MEMBER):
                sock = self._connect(address)
                if sock is not None:
                    self._idle.append(sock)
        self._round()
        self._thread = threading.Thread(target=self._harass, daemon=True, name="raft-stranger")
        self._thread.start()

    def _connect(self, address: str) -> socket.socket | None:
        host, port = address.rsplit(":", 1)
        try:
            return socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            self.counts["connect_failed"] += 1  # a member that is down or cut off right now
            return None

    def _round(self) -> None:
        for address in self.nodes:
            for payload in self._payloads:
                sock = self._connect(address)
                if sock is None:
                    continue
                with sock:
                    self.counts["hostile"] += 1
                    try:
                        sock.sendall(payload)
                    except OSError:
                        pass  # hung up on before all of it was sent
                    key = "hung_up" if hung_up_on(sock, self.HANG_UP_WITHIN_S) else "kept_open"
                    self.counts[key] += 1

    def _harass(self) -> None:
        while not self._stop.wait(0.5):
            self._round()

    def heal(self, c):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        idle_dropped = sum(hung_up_on(sock, 0.05) for sock in self._idle)
        for sock in self._idle:
            sock.close()
        self.info = {**self.counts, "idle": len(self._idle), "idle_dropped": idle_dropped}
        # Every hostile connection was hung up on, and of the idle ones at least those past
        # the bound (all of them, once the naming deadline has passed).
        may_stay = raft_limits.RAFT_UNNAMED_CONNECTIONS_MAX * len(self.nodes)
        self.info["ok"] = (self.counts["kept_open"] == 0 and self.counts["hostile"] > 0
                           and idle_dropped >= len(self._idle) - may_stay)


# -- the client GC pause ------------------------------------------------------------------


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def gc_pause_schedule(c: ChaosCluster, recorder, resource: str, out_path: str, *, ttl_ms: int = 1500,
                      unfenced: str | None = None, timeout_s: float = 40.0) -> dict:
    """The deterministic client-GC-pause schedule.

    1. A victim process acquires ``resource`` (``ttl_ms``), checks its lease (KeepAlive ok) and
       SIGSTOPs itself between that check and its write.
    2. The harness waits until the lease expired and a new owner (``recorder``, process of the
       caller) acquired and wrote ``<owner>-value`` to key ``a``.
    3. The harness resumes the victim, which writes its stale value with its old token — to the
       FencedStore, or (``unfenced`` = host:port) to a store that ignores tokens.
    Returns what happened: victim token, owner token, the victim's write outcome, the final value.
    """
    cmd = [sys.executable, "-m", "chaos.workload", "--gc-pause", "--process", f"gc-victim-{resource}",
           "--endpoints", ",".join(c.endpoints), "--out", out_path, "--resource", resource, "--ttl-ms", str(ttl_ms)]
    if unfenced:
        cmd += ["--unfenced", unfenced]
    victim = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    c.adopt(victim.pid)
    deadline = time.monotonic() + timeout_s
    result: dict = {"resource": resource, "unfenced": bool(unfenced)}
    try:
        ready, _, _ = select.select([victim.stdout], [], [], timeout_s)
        line = victim.stdout.readline() if ready else ""
        if not line.startswith("PAUSING"):
            raise RuntimeError(f"gc victim did not pause: {line!r}")
        result["victim_token"] = int(line.split("token=")[1])
        wait_until(lambda: _proc_state(victim.pid) == "T", 5, what="victim stopped")
        # the new owner: acquire once the lease expired, then write
        owner_value = f"{recorder.process}-{resource}-owner"

        def acquired():
            outcome, res = recorder.acquire(resource, 5000, holder=recorder.process)
            return (res,) if outcome == "ok" else None

        # An operator's fence-all or restore (the soak's operator role) between the owner's
        # acquire and its write fences the owner too, rightly (I11): it owns no lease any more,
        # so it acquires again, as a real client would. The victim's write still comes after.
        result["owner_refenced"] = 0
        while True:
            (res,) = wait_until(acquired, max(0.0, deadline - time.monotonic()), interval_s=0.2,
                                what="the new owner to acquire")
            if unfenced:
                from chaos.workload import unfenced_put

                unfenced_put(unfenced, "a", owner_value)
                outcome, reason = "ok", None
            else:
                outcome, answer = recorder.write(resource, "a", owner_value, res.token)
                reason = getattr(answer, "reason", None) if outcome != "ok" else None
            if reason != ErrorReason.STALE_TOKEN or time.monotonic() >= deadline:
                break
            result["owner_refenced"] += 1
        result["owner_token"] = res.token
        result["owner_write"] = outcome
        os.kill(victim.pid, signal.SIGCONT)
        ready, _, _ = select.select([victim.stdout], [], [], max(1.0, deadline - time.monotonic()))
        line = victim.stdout.readline() if ready else ""
        parts = line.split()
        result["victim_write"] = parts[1] if len(parts) > 1 else "none"
        result["victim_reason"] = parts[2] if len(parts) > 2 else ""
        victim.wait(timeout=max(1.0, deadline - time.monotonic()))
        result["owner_value"] = owner_value
        if unfenced:
            from chaos.workload import unfenced_get

            result["final_value"] = unfenced_get(unfenced, "a")
        else:
            outcome, r = recorder.read(resource, "a")
            result["final_value"] = r.value.decode() if outcome == "ok" and r.found else None
        recorder.release(resource, res.token)
    finally:
        if victim.poll() is None:
            os.kill(victim.pid, signal.SIGCONT)
            victim.kill()
            victim.wait()
    return result


_GC_COUNTER = itertools.count(1)


class ClientGcPause(Fault):
    """The client GC pause (see ``gc_pause_schedule``): inject runs the whole schedule; the
    stale write must be refused with STALE_TOKEN and the new owner's value must survive."""

    kind = "client_gc_pause"
    failure = "stale write not refused as expected"

    def __init__(self, recorder_factory, out_dir: str) -> None:
        super().__init__()
        self.recorder_factory = recorder_factory
        self.out_dir = out_dir

    def inject(self, c):
        self.count = next(_GC_COUNTER)
        resource = f"gc{self.count}"
        rec = self.recorder_factory()
        out = os.path.join(self.out_dir, f"gc-victim-{self.count}.jsonl")
        self.info = gc_pause_schedule(c, rec, resource, out)
        self.info["ok"] = (self.info.get("victim_write") == "refused"
                           and self.info.get("victim_reason") == ErrorReason.STALE_TOKEN
                           and self.info.get("final_value") == self.info.get("owner_value"))
        self.nodes = []

    def heal(self, c):
        pass


def ci_schedule(recorder_factory, out_dir: str, with_delay: bool = True) -> list[Fault]:
    faults: list[Fault] = [
        Pause("leader"), Pause("follower"), KillRestart("leader"), KillRestart("follower"),
        Partition("follower"), Partition("leader"), Partition("bridge"), OneWay(), PacketLoss(30),
        RaftStranger(),
    ]
    if with_delay:
        faults.append(Delay(100, 20))
    faults += [
        ClientGcPause(recorder_factory, out_dir), PowerLoss("leader"), KillTwo(), FullRestart(),
        PowerLoss("all"),
    ]
    return faults


def random_fault(rng: random.Random, recorder_factory, out_dir: str, with_delay: bool = True) -> Fault:
    makers = [
        lambda: Pause("leader"), lambda: Pause("follower"), lambda: KillRestart("leader"),
        lambda: KillRestart("follower"), lambda: Partition("follower"), lambda: Partition("leader"),
        lambda: Partition("bridge"), lambda: OneWay(), lambda: PacketLoss(rng.choice([10, 30, 50])),
        lambda: PowerLoss("leader"), lambda: KillTwo(), lambda: ClientGcPause(recorder_factory, out_dir),
        lambda: FullRestart(), lambda: PowerLoss("all"),
        lambda: RaftStranger(),
    ]
    if with_delay:
        makers.append(lambda: Delay(rng.choice([50, 100, 200]), 20))
    return rng.choice(makers)()


def delay_available() -> bool:
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        return False
    return True
