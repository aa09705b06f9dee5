"""``fencingd``: the server command.

    fencingd serve --config node1.toml [--flag value ...]   one cluster member
    fencingd dev [--data-dir DIR] [--base-port N]            a local three-member cluster
    fencingd health --address HOST:PORT                      exit 0 iff SERVING; 2 unreachable, 4 not serving
    fencingd keygen --private-key F --public-key G           a token signing key pair (DESIGN §6)
    fencingd gen-secret FILE                                 a peer credential (raft_secret_file), mode 0600
    fencingd check-config FILE [--values-only]               exit 0 iff ``serve`` would accept the config
    fencingd restore-cluster --backup F --epoch-margin N ...  offline: a new cluster's data dirs from a backup
    fencingd --version

Owns: argument parsing, logging setup, signal handling (SIGTERM/SIGINT stop a member, SIGHUP
re-reads its API certificate and its peer secrets: SECURITY.md), and the ``dev`` supervisor that runs three
``fencingd serve`` children on loopback.
Must never: serve RPCs itself (server.py does) or leave a child running when it exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

# The gRPC core logs a line at INFO for every failed TLS handshake (~220 B, from anyone who
# connects; no log filter of ours sees the core's lines): only its errors, unless the operator
# sets GRPC_VERBOSITY. The core reads it once, when grpc is first imported: before the imports below.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from coordinator.client.version import distribution_version
from coordinator.server import api_conns, cpu_pin, health_probe, log_limits, member_dir, sd_notify, server_extra
from coordinator.server import config as config_mod

log = logging.getLogger("fencingd")

# dev: how long three fresh members get to elect a leader and pass a read barrier. An
# election is 1-2 s; a slow CI machine starting three Python processes needs far more.
DEV_START_TIMEOUT_S = 60.0
# dev: how long children get to stop after SIGTERM before they are killed (their own
# grace period is 5 s, plus closing the Raft node).
DEV_STOP_TIMEOUT_S = 15.0
DEV_MEMBERS = 3
# serve: how often the main thread looks for a SIGHUP it must act on; a certificate swap a
# fraction of a second late is fine, and the wait costs nothing between looks.
SIGNAL_POLL_S = 0.2
# serve: how often start-up looks whether the Raft port is bound before it prints READY; it
# binds within milliseconds of the start, so READY is late by at most this.
LISTEN_POLL_S = 0.01
# dev: API ports are base, base+1, base+2; Raft ports are base+100, +101, +102; metrics
# (Prometheus, HTTP) base+200, +201, +202.
DEV_RAFT_PORT_OFFSET = 100
DEV_METRICS_PORT_OFFSET = 200
# dev: the token signing pair (made on first start, kept in the data dir).
DEV_SIGNING_KEY = "token-signing.pem"
DEV_VERIFY_KEY = "token-signing.pub"
# dev: the peer credential all three members share (made on first start, kept in the data dir).
DEV_RAFT_SECRET = "raft-secret"
# gen-secret: 32 random bytes as 64 hex characters. The Raft library stretches the secret under a
# fixed salt, so its own entropy is all that protects it: 256 bits, twice the key it becomes.
RAFT_SECRET_RANDOM_BYTES = 32


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts (UTC, ISO 8601 with milliseconds), level,
    logger, msg, and exc (the traceback) when there is one -- what log shippers parse without
    a pattern. json.dumps escapes newlines, so a record never spans lines."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def _setup_logging(level: str, log_format: str = "text",
                   refused_log_window_s: float = log_limits.REFUSED_LOG_WINDOW_S) -> None:
    handler = logging.StreamHandler(sys.stderr)
    text_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(text_format))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    # The gRPC library logs a line per request it cannot decode, from anyone who connects:
    # a few per kind and window, the rest counted (log_limits).
    log_limits.install_library_filter(log_limits.RefusedLines(window_s=refused_log_window_s))




def _name_os_threads() -> None:
    """Give every thread started from now on its Python name at the OS level (Linux), so
    ``top -H``, ``ps -L``, perf and ``/proc/PID/task/*/comm`` tell the Raft thread
    (``_autoTickThread``) from the gRPC workers (``grpc_N``). Costs one call per new thread."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return

    def name_this_thread(*_) -> None:
        sys.setprofile(None)  # the hook's only job is this first call in the new thread
        name = threading.current_thread().name
        match = _UNNAMED_THREAD.fullmatch(name)  # "Thread-3 (_serve)": the target says more
        prctl(15, (match.group(1) if match else name).encode()[:15], 0, 0, 0)  # PR_SET_NAME

    threading.setprofile(name_this_thread)


_UNNAMED_THREAD = re.compile(r"Thread-\d+ \((.+)\)")


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        cfg = config_mod.from_args(args)
    except config_mod.ConfigError as exc:
        print(f"fencingd: configuration error: {exc}", file=sys.stderr)
        return 2
    foreign = member_dir.why_not_mine(cfg)  # another member's data dir: a person must look (exit 2)
    if foreign is not None:
        print(f"fencingd: configuration error: {foreign}", file=sys.stderr, flush=True)
        return 2
    try:
        # Before anything opens a descriptor; exit 2 like a configuration error: a restart
        # would meet the same limit (the systemd unit does not restart on 2).
        api_conns.ensure_fd_budget(cfg)
    except api_conns.FdBudgetError as exc:
        print(f"fencingd: cannot start: {exc}", file=sys.stderr, flush=True)
        return 2
    _setup_logging(cfg.log_level, cfg.log_format, cfg.refused_log_window_s)
    if cfg.peers_unauthenticated and not cfg.raft_is_loopback:  # only with insecure_peer_transport
        log.warning(
            "insecure_peer_transport: Raft peers are not authenticated; anyone who reaches %s can pose"
            " as a member and commit anything (set raft_secret_file)", cfg.raft_address,
        )
    elif cfg.peers_unauthenticated:
        log.info("Raft peers are not authenticated: raft_address %s is loopback-only", cfg.raft_address)
    if cfg.insecure_api and not cfg.api_is_loopback:
        log.warning(
            "insecure_api: the API on %s knows no caller (no principals_file, no tls_client_ca_file); anyone"
            " who reaches it may take, release and write every resource", cfg.bind_address,
        )
    placement = cpu_pin.Placement(cfg.cpu_affinity, cfg.member_index, log=log.info)
    placement.start()  # before any thread starts: threads inherit where they were started
    _name_os_threads()
    from coordinator.raft.replica import freeze_after_slow_full_passes
    from coordinator.server.app import (  # imports grpc and the Raft layer: after config checks
        FencingServer,
        StartupError,
    )

    freeze_after_slow_full_passes()  # the GC's full passes stay short as the state grows (replica.py)

    notifier = sd_notify.Notifier.from_environment()  # systemd Type=notify; nothing without it
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # SIGHUP re-reads the API's TLS files and the peer secrets; the handler only flags it, the loop below does the
    # reading (and logging), outside the interrupted frame. Before, SIGHUP killed the member.
    reload = threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    server = None
    try:
        server = FencingServer(cfg, on_leadership=placement.on_leadership)
        server.start()
    except (OSError, StartupError) as exc:  # a port in use, an address not on this machine
        print(f"fencingd: cannot start: {exc}", file=sys.stderr, flush=True)
        if server is not None:
            server.node.close()
        return 1
    # READY means both listeners are bound: the Raft port binds on the node's first tick
    # (milliseconds); a name that does not resolve yet keeps it waiting, logged by the transport.
    while not server.listening():
        if stop.wait(LISTEN_POLL_S):
            notifier.stopping()
            server.stop()
            return 0
    print(f"READY member={cfg.raft_address} api={cfg.bind_address} pid={os.getpid()}", flush=True)
    _serve_until_stopped(server, stop, reload, notifier)
    log.info("signal received: stopping (grace %.1f s)", cfg.shutdown_grace_s)
    notifier.stopping()
    server.stop()
    return 0


def _serve_until_stopped(server, stop: threading.Event, reload: threading.Event,
                         notifier: sd_notify.Notifier) -> None:
    """Until ``stop``: act on SIGHUP, and tell systemd (Type=notify) READY=1 the first time the
    member serves (a quorum and a read barrier, as its health says), then each change."""
    notifier.status("listening: waiting for a quorum and a read barrier")
    ready, serving = False, False
    while not stop.wait(SIGNAL_POLL_S):
        if reload.is_set():
            reload.clear()  # before reading: a SIGHUP during the read gets a read of its own
            server.reload()
        now = server.serving()
        if now == serving:
            continue
        serving = now
        text = "serving" if now else "not serving: no quorum or no read barrier yet"
        if now and not ready:
            notifier.ready(text)
            ready = True
        else:
            notifier.status(text)


def cmd_check_config(args: argparse.Namespace) -> int:
    """Exit 0 iff ``serve`` would accept this configuration; binds and creates nothing."""
    if args.file:
        args.config = args.file
    try:
        cfg = config_mod.from_args(args, read_files=not args.values_only)
    except config_mod.ConfigError as exc:
        print(f"fencingd: configuration error: {exc}", file=sys.stderr, flush=True)
        return 2
    foreign = None if args.values_only else member_dir.why_not_mine(cfg)
    if foreign is not None:
        print(f"fencingd: configuration error: {foreign}", file=sys.stderr, flush=True)
        return 2
    print(f"{args.config or 'flags'}: ok", flush=True)
    return 0


# -- dev -----------------------------------------------------------------------------


def port_free(host: str, port: int) -> bool:
    """Nobody listens there. SO_REUSEADDR, as the servers use: our own last run's
    TIME_WAIT connections must not block a restart."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _create_file(path: str, data: bytes, mode: int) -> str | None:
    """Create ``path`` holding ``data`` with ``mode``, synced; never overwrites. The error line, or None."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return None


def _write_key_pair(private_path: str, public_path: str) -> str | None:
    """Create a fresh Ed25519 pair: the private half mode 0600, the public half 0644.
    Never overwrites a file, never leaves half a pair; the error line, or None."""
    from coordinator.client.proof import generate_key_pair

    private, public = generate_key_pair()
    error = _create_file(private_path, private, 0o600)
    if error is None:
        error = _create_file(public_path, public, 0o644)
        if error is not None:
            os.unlink(private_path)  # a lone private key is useless
    return error


def _write_raft_secret(path: str) -> str | None:
    import secrets

    return _create_file(path, (secrets.token_hex(RAFT_SECRET_RANDOM_BYTES) + "\n").encode(), 0o600)


def cmd_gen_secret(args: argparse.Namespace) -> int:
    """Write a fresh peer credential for raft_secret_file (copy the same file to every member)."""
    error = _write_raft_secret(args.file)
    if error is not None:
        print(f"fencingd gen-secret: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"peer credential (raft_secret_file, the same on every member): {args.file}", flush=True)
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a fresh Ed25519 pair: the private half for token_signing_key_file on every
    member, the public half for guards at external resources."""
    error = _write_key_pair(args.private_key, args.public_key)
    if error is not None:
        print(f"fencingd keygen: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"private key (token_signing_key_file, every member): {args.private_key}", flush=True)
    print(f"public key (for guards at external resources):     {args.public_key}", flush=True)
    return 0


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the dev supervisor dies (Linux), never orphaned."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


@dataclasses.dataclass(frozen=True)
class _DevCluster:
    """Where ``fencingd dev``'s members listen and keep their files, all under ``data_dir``."""

    data_dir: str
    apis: list[str]
    rafts: list[str]
    metrics: list[str]

    @classmethod
    def on(cls, data_dir: str, host: str, base_port: int) -> _DevCluster:
        def addresses(offset: int) -> list[str]:
            return [f"{host}:{base_port + offset + i}" for i in range(DEV_MEMBERS)]

        return cls(data_dir, addresses(0), addresses(DEV_RAFT_PORT_OFFSET), addresses(DEV_METRICS_PORT_OFFSET))

    @property
    def members(self) -> list[str]:
        return [f"{r}={a}" for r, a in zip(self.rafts, self.apis, strict=True)]

    @property
    def signing_key(self) -> str:
        return os.path.join(self.data_dir, DEV_SIGNING_KEY)

    @property
    def verify_key(self) -> str:
        return os.path.join(self.data_dir, DEV_VERIFY_KEY)

    @property
    def raft_secret(self) -> str:
        return os.path.join(self.data_dir, DEV_RAFT_SECRET)

    @property
    def logs(self) -> list[str]:
        return [os.path.join(self.data_dir, f"node{i}.log") for i in range(DEV_MEMBERS)]

    def busy_ports(self, host: str) -> list[str]:
        return [a for a in self.apis + self.rafts + self.metrics if not port_free(host, int(a.rsplit(":", 1)[1]))]


def _dev_credentials(dev: _DevCluster) -> str | None:
    """The dev cluster's signing pair and peer credential, made on its first start; the error line, or None."""
    # The dev cluster signs token proofs (DESIGN §6) with a key made on its first start.
    if not os.path.exists(dev.signing_key):
        error = _write_key_pair(dev.signing_key, dev.verify_key)
        if error is not None:
            return error
    # Members authenticate each other even on loopback: the dev cluster makes its own credential.
    if not os.path.exists(dev.raft_secret):
        return _write_raft_secret(dev.raft_secret)
    return None


def _write_dev_config(dev: _DevCluster, i: int, log_level: str) -> str:
    """Member ``i``'s TOML file, written anew on every start; its path."""
    cfg_path = os.path.join(dev.data_dir, f"node{i}.toml")
    with open(cfg_path, "w", encoding="utf-8") as f:
        f.write(
            "# Written by `fencingd dev` on every start.\n"
            f'data_dir = "{os.path.join(dev.data_dir, f"node{i}")}"\n'
            f'raft_address = "{dev.rafts[i]}"\n'
            f"members = {_toml_list(dev.members)}\n"
            f'metrics_address = "{dev.metrics[i]}"\n'
            f'token_signing_key_file = "{dev.signing_key}"\n'
            f'raft_secret_file = "{dev.raft_secret}"\n'
            f'log_level = "{log_level}"\n'
            # Harmless on later starts: once formed, the cluster refuses a re-bootstrap.
            'initial_cluster_state = "new"\n'
        )
    return cfg_path


def _start_dev_member(cfg_path: str, log_path: str) -> subprocess.Popen:
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", cfg_path],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches us; we stop the children in order
            preexec_fn=_die_with_parent,
        )


def _stop_dev_members(children: list[subprocess.Popen]) -> int:
    """SIGTERM every member still running, kill those that outlast DEV_STOP_TIMEOUT_S; 0 iff all stopped cleanly."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + DEV_STOP_TIMEOUT_S
    clean = True
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            clean = False
        clean = clean and child.returncode == 0
    print("fencingd dev: all members stopped" + ("" if clean else " (some did not stop cleanly)"), flush=True)
    return 0 if clean else 1


def _wait_dev_healthy(dev: _DevCluster, children: list[subprocess.Popen], stop: threading.Event,
                      start_timeout: float) -> str:
    """Wait for every member to be healthy: "up"; "failed" (said on stderr) if one exits or
    time runs out first; "stopped" if a signal comes first."""
    deadline = time.monotonic() + start_timeout
    waiting = set(range(DEV_MEMBERS))
    while waiting and not stop.is_set():
        for i in sorted(waiting):
            if children[i].poll() is not None:
                print(f"fencingd dev: member {i} exited with {children[i].returncode}; see {dev.logs[i]}",
                      file=sys.stderr)
                return "failed"
            if health_probe.healthy(dev.apis[i]):
                waiting.discard(i)
        if time.monotonic() > deadline:
            print(f"fencingd dev: not healthy after {start_timeout:.0f} s; see {', '.join(dev.logs)}", file=sys.stderr)
            return "failed"
        if waiting:
            stop.wait(0.2)
    return "stopped" if stop.is_set() else "up"


def _print_dev_endpoints(dev: _DevCluster) -> None:
    apis, logs = dev.apis, dev.logs
    print("fencingd dev: cluster is up", flush=True)
    for i in range(DEV_MEMBERS):
        print(f"  member {i}: api {apis[i]}  raft {dev.rafts[i]}  metrics http://{dev.metrics[i]}/metrics"
              f"  log {logs[i]}", flush=True)
    print(f"  token proofs: Acquire signs them; guards verify with {dev.verify_key}", flush=True)
    print(f"  peer credential (raft_secret_file of all three): {dev.raft_secret}", flush=True)
    print(f"ENDPOINTS {','.join(apis)}", flush=True)
    print(f"try: fencingctl --endpoints {','.join(apis)} status", flush=True)
    print(f"     fencingctl --endpoints {','.join(apis)} acquire orders/7 --ttl-ms 10000 --holder me", flush=True)
    print("Ctrl-C stops all three; run `fencingd dev` again to restart on the same data.", flush=True)


def _report_dev_exits(dev: _DevCluster, children: list[subprocess.Popen], stop: threading.Event) -> None:
    """Until a signal comes: say once of each member that exits."""
    reported: set[int] = set()
    while not stop.wait(0.5):
        for i, child in enumerate(children):
            if child.poll() is not None and i not in reported:
                reported.add(i)
                print(f"fencingd dev: member {i} exited with {child.returncode}; see {dev.logs[i]}", file=sys.stderr,
                      flush=True)


def cmd_dev(args: argparse.Namespace) -> int:
    """Three ``fencingd serve`` children on loopback, until SIGINT or SIGTERM stops them all."""
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    dev = _DevCluster.on(data_dir, args.host, args.base_port)
    busy = dev.busy_ports(args.host)
    if busy:
        print(f"fencingd dev: ports in use: {', '.join(busy)} (choose another --base-port)", file=sys.stderr)
        return 1
    error = _dev_credentials(dev)
    if error is not None:
        print(f"fencingd dev: {error}", file=sys.stderr)
        return 1
    notifier = sd_notify.Notifier.from_environment()  # taken before the members start: not theirs
    children = [_start_dev_member(_write_dev_config(dev, i, args.log_level), dev.logs[i]) for i in range(DEV_MEMBERS)]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"fencingd dev: starting {DEV_MEMBERS} members, data in {data_dir}", flush=True)
    started = _wait_dev_healthy(dev, children, stop, args.start_timeout)
    if started != "up":
        code = _stop_dev_members(children)
        return code if started == "stopped" else 1  # stopped by a signal: as after Ctrl-C later
    _print_dev_endpoints(dev)
    notifier.ready(f"{DEV_MEMBERS} members serving: {','.join(dev.apis)}")
    _report_dev_exits(dev, children, stop)
    notifier.stopping()
    return _stop_dev_members(children)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fencingd", description="Raft-replicated fencing coordinator server.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {distribution_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one cluster member")
    config_mod.add_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser(
        "check-config", help="check a configuration as serve would, without starting: exit 0 if it is usable"
    )
    check.add_argument("file", nargs="?", help="TOML file (the same as --config)")
    check.add_argument("--values-only", action="store_true",
                       help="check keys and values only, not the files they name nor this machine's CPUs"
                            " (for a configuration meant for another machine)")
    config_mod.add_arguments(check)
    check.set_defaults(func=cmd_check_config)
    dev = sub.add_parser("dev", help="run a local three-member cluster on loopback until Ctrl-C")
    dev.add_argument("--data-dir", default="./fencing-dev-data",
                     help="where the members keep their data (reused on restart)")
    dev.add_argument("--base-port", type=int, default=7100,
                     help="API ports N..N+2, Raft ports N+100..N+102, metrics N+200..N+202")
    dev.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    dev.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    dev.add_argument("--start-timeout", type=float, default=DEV_START_TIMEOUT_S, help="seconds to wait for health")
    dev.set_defaults(func=cmd_dev)
    health_probe.add_parser(sub)
    keygen = sub.add_parser(
        "keygen", help="write an Ed25519 key pair for signed token proofs (token_signing_key_file)"
    )
    keygen.add_argument("--private-key", required=True, help="file to create for the private key (mode 0600)")
    keygen.add_argument("--public-key", required=True, help="file to create for the public key")
    keygen.set_defaults(func=cmd_keygen)
    gen_secret = sub.add_parser(
        "gen-secret", help="write a peer credential for raft_secret_file (64 hex characters, mode 0600)"
    )
    gen_secret.add_argument("file", help="file to create (never overwritten); copy it to every member")
    gen_secret.set_defaults(func=cmd_gen_secret)
    # Imported here, not at the top: it reaches the Raft layer (the Raft library, a [server]
    # dependency), and a client-only install must get server_extra's one line first (main).
    from coordinator.server import restore_cluster

    restore_cluster.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    server_extra.require("fencingd")  # a client-only install: one line naming the extra, no traceback
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(words)
    except SystemExit as done:
        # health's usage error is 1, as grpc_health_probe's: argparse's 2 there means unreachable.
        if done.code == 2 and words[:1] == ["health"]:
            return health_probe.HEALTH_USAGE
        raise
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
