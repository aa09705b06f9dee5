"""The settings of one ``fencingd serve`` process: ``ServerConfig``, field by field.

Owns: ``ServerConfig`` (every setting with its default and a doc line that gives its unit),
what follows from the settings (the member map, this member's addresses, whether the Raft
port and the API are loopback-only), reading the files the settings name (admin token, Raft
secrets, TLS files, token signing key, principals, the CPU to pin) with a ``ConfigError``
that names the setting, and parsing ``HOST:PORT`` and ``RAFT=API`` values.
Must never: load a file of settings or flags (config.py does), decide whether a whole
configuration is usable (config_checks.py does), start anything or open sockets.
"""

from __future__ import annotations

import dataclasses
import ipaddress

from coordinator.client.proof import ProofError, ProofSigner
from coordinator.raft import limits as raft_limits
from coordinator.server import certs, cpu_pin, log_limits
from coordinator.server.auth import PrincipalsError, load_principals


class ConfigError(ValueError):
    """The configuration is unusable; the message names the key and says why."""


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    # -- identity and cluster -----------------------------------------------------------
    data_dir: str = dataclasses.field(
        default="", metadata=_doc("directory of this member's journal and snapshots (required)")
    )
    raft_address: str = dataclasses.field(
        default="",
        metadata=_doc("host:port this member's Raft listens on; also its member id (required)"),
    )
    members: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata=_doc(
            "every member, this one included, as RAFT_HOST:PORT=API_HOST:PORT (required; an odd count)"
        ),
    )
    listen_address: str = dataclasses.field(
        default="",
        metadata=_doc("host:port the gRPC server binds; default: this member's API address"),
    )
    # -- admin ------------------------------------------------------------------------------
    admin_token: str = dataclasses.field(
        default="",
        metadata=_doc(
            "bearer token Admin calls must carry ('authorization: Bearer TOKEN'); empty: Admin is open"
        ),
    )
    admin_token_file: str = dataclasses.field(
        default="", metadata=_doc("file holding the admin token (keeps it out of ps); exclusive with admin_token")
    )
    # -- TLS on the gRPC API (the Raft port is not covered: RAFT.md "Not closed here") -----
    tls_cert_file: str = dataclasses.field(
        default="", metadata=_doc("PEM certificate chain the gRPC API serves; empty: plaintext (with tls_key_file)")
    )
    tls_key_file: str = dataclasses.field(default="", metadata=_doc("PEM private key of tls_cert_file"))
    tls_client_ca_file: str = dataclasses.field(
        default="",
        metadata=_doc("PEM CA bundle; set: clients must present a certificate it signed (mutual TLS)"),
    )
    raft_secret_file: str = dataclasses.field(
        default="",
        metadata=_doc(
            "file holding the peer credential, a secret shared by every member (fencingd gen-secret):"
            " Raft traffic is encrypted and authenticated (Fernet), and a peer without it is dropped"
            " before its data is read; required unless raft_address is loopback (SECURITY.md)."
            " During a rotation it holds several, one per line: the first is sent with, any is"
            " accepted; SIGHUP reads it again (SECURITY.md, \"What SIGHUP reloads\")"
        ),
    )
    insecure_peer_transport: bool = dataclasses.field(
        default=False,
        metadata=_doc(
            "true: run without raft_secret_file on a non-loopback raft_address, so anyone who"
            " reaches the Raft port can pose as a member and commit anything; logged at every start"
        ),
    )
    token_signing_key_file: str = dataclasses.field(
        default="",
        metadata=_doc(
            "PEM Ed25519 private key (fencingd keygen), the same on every member: Acquire then"
            " returns token_proof, a signature a guard at an external resource checks with the"
            " public key (DESIGN §6, coordinator/client/proof.py); empty: no proofs"
        ),
    )
    principals_file: str = dataclasses.field(
        default="",
        metadata=_doc(
            "TOML file of principals (bearer-token sha256, resource prefixes, admin; see"
            " coordinator/server/auth.py); set: every fencing RPC needs a principal's token; empty: open data plane"
        ),
    )
    insecure_api: bool = dataclasses.field(
        default=False,
        metadata=_doc(
            "true: serve the API on a non-loopback address without principals_file or client"
            " certificates (tls_client_ca_file), so anyone who reaches it may take, release and"
            " write every resource (and call Admin, without admin_token); logged at every start"
        ),
    )
    reflection: bool = dataclasses.field(
        # On: grpcurl and similar tools list and describe the services without a .proto file.
        default=True,
        metadata=_doc(
            "true: serve gRPC server reflection; it then needs a principal's token or the admin"
            " token when either is configured, and its streams count under streams_max; false: not served"
        ),
    )
    audit_log_path: str = dataclasses.field(
        default="",
        metadata=_doc("file that gets one JSON line per Admin call; empty: the process log only"),
    )
    refused_log_window_s: float = dataclasses.field(
        # A minute is what an operator reads at a glance (log_limits.REFUSED_LOG_WINDOW_S).
        default=float(log_limits.REFUSED_LOG_WINDOW_S),
        metadata=_doc(
            "seconds: the window of the log lines about refused calls (audit lines of refused Admin"
            " calls, the gRPC library's lines about undecodable requests): a few per caller and"
            " window, the rest counted and the count written on the caller's next line"
        ),
    )
    # -- proposals and backpressure -------------------------------------------------------------
    propose_timeout_max_s: float = dataclasses.field(
        default=5.0,
        metadata=_doc(
            "seconds: longest wait for a proposal's fate; an election takes 1-2 s, so 5 s rides one out"
        ),
    )
    propose_deadline_margin_s: float = dataclasses.field(
        default=0.1,
        metadata=_doc(
            "seconds kept back from the RPC deadline, so OUTCOME_UNKNOWN reaches the client before its deadline"
        ),
    )
    inflight_proposals_max: int = dataclasses.field(
        default=256,
        metadata=_doc("proposals waiting for Raft at once; beyond it RESOURCE_EXHAUSTED/OVERLOADED"),
    )
    # -- gRPC server ----------------------------------------------------------------------
    grpc_threads: int = dataclasses.field(
        default=64,
        metadata=_doc("threads serving RPCs; a KeepAliveStream or waiting Acquire holds one while it lasts"),
    )
    grpc_max_concurrent_rpcs: int = dataclasses.field(
        default=512,
        metadata=_doc("RPCs admitted at once (running or queued for a thread); beyond it RESOURCE_EXHAUSTED"),
    )
    # -- connections (issue 26: idle connections took every descriptor) ---------------------
    api_connections_max: int = dataclasses.field(
        # Far more than a member's clients need (a client process keeps one channel per member),
        # and with the reserve (api_conns.fd_reserve) well inside the usual descriptor limits.
        default=1000,
        metadata=_doc(
            "connections the gRPC API holds at once, handshaking or established, from every caller;"
            " a connection beyond it is closed as soon as it is accepted. With the descriptors kept"
            " for the Raft port, the journal, snapshots and metrics it must fit under the process's"
            " descriptor limit (RLIMIT_NOFILE, raised to its hard limit at start), or the member"
            " refuses to start"
        ),
    )
    api_connections_per_peer_max: int = dataclasses.field(
        # A tenth of api_connections_max: ten hosts (or one host behind ten NAT addresses) are
        # needed to fill the API, and a busy client host still has room for 100 processes.
        default=100,
        metadata=_doc(
            "connections the gRPC API holds from one remote IP address; the newest beyond it are"
            " closed within a second (a scan of the kernel's connection table once a second)"
        ),
    )
    api_handshake_timeout_s: float = dataclasses.field(
        # A TLS handshake and the HTTP/2 preface take milliseconds on a LAN and well under a
        # second across continents; 10 s leaves a slow client room and a silent one little time.
        default=10.0,
        metadata=_doc(
            "seconds a new API connection has to finish its TLS handshake and send the HTTP/2"
            " preface and settings; one that has not is closed (at api_connection_idle_s instead, if shorter)"
        ),
    )
    api_connection_idle_s: float = dataclasses.field(
        # Five minutes: a client between bursts keeps its connection (and a KeepAliveStream is
        # an open call, never idle); one that went quiet gives its descriptor back.
        default=300.0,
        metadata=_doc(
            "seconds an API connection may carry no call before the server closes it (HTTP/2"
            " GOAWAY; gRPC looks once per period, so within one to two periods of its last call);"
            " clients reconnect on their next call"
        ),
    )
    # -- streams (issues 14, 26: idle streams took every worker thread) --------------------
    streams_max: int = dataclasses.field(
        # A quarter of the default grpc_threads: whatever streams do, 48 threads stay for
        # health, Admin and unary calls (one stream keeps any number of leases alive).
        default=16,
        metadata=_doc(
            "streaming RPCs open at once on this member, of every service (KeepAliveStream, Watch,"
            " Admin's SnapshotStream and RestoreStream, Health.Watch, reflection); with"
            " acquire_waiters_max and BACKUP_TRANSFERS_MAX below grpc_threads, so they never hold"
            " every thread; beyond it RESOURCE_EXHAUSTED/LIMIT_EXCEEDED (limit streams_max)"
        ),
    )
    streams_per_principal_max: int = dataclasses.field(
        # A client needs one stream per process; 4 lets a few processes share a principal while
        # no principal takes more than a quarter of streams_max.
        default=4,
        metadata=_doc(
            "streaming RPCs one principal (without a valid credential: one client host) may have open"
            " on this member; beyond it RESOURCE_EXHAUSTED/LIMIT_EXCEEDED (limit streams_per_principal_max)"
        ),
    )
    stream_idle_timeout_s: float = dataclasses.field(
        # Holders keep alive at a fraction of their TTL: 60 s covers TTLs up to a few minutes;
        # a holder with a longer TTL opens a new stream (or calls KeepAlive) when it needs one.
        default=60.0,
        metadata=_doc(
            "seconds a streaming RPC may stay idle -- no request from its client, or for a"
            " server-streaming one (Health.Watch) nothing to send -- before the server closes it"
            " with RESOURCE_EXHAUSTED/LIMIT_EXCEEDED (limit stream_idle_timeout_s)"
        ),
    )
    watchers_per_principal_max: int = dataclasses.field(
        # An Election observer and a `fencingctl watch` per client host, with streams to spare
        # for keep-alives under streams_per_principal_max.
        default=2,
        metadata=_doc(
            "Watch streams one principal (without a valid credential: one client host) may have open"
            " on this member, each also counted as a stream; beyond it RESOURCE_EXHAUSTED/LIMIT_EXCEEDED"
            " (limit watchers_per_principal_max)"
        ),
    )
    # -- waiting Acquires (issue 14: like streams, each holds a worker thread while it waits) --
    acquire_waiters_max: int = dataclasses.field(
        # An eighth of the default grpc_threads: with streams_max, 32 of 64 threads stay for
        # health, Admin and unary calls; a waiter makes no entries while it waits, and 8 is plenty
        # for the handful of resources that see contention at once.
        default=8,
        metadata=_doc(
            "Acquires waiting server-side (wait_ms on a held lease) at once on this member;"
            " streams_max + acquire_waiters_max must be below grpc_threads; beyond it the Acquire"
            " is answered at once as if wait_ms were 0 (LEASE_HELD if the lease is held)"
        ),
    )
    acquire_waiters_per_principal_max: int = dataclasses.field(
        # A quarter of acquire_waiters_max: no principal (or client host) keeps the others from
        # waiting, and a client waits on a few resources at once.
        default=2,
        metadata=_doc(
            "Acquires one principal (on an open data plane: one client host) may have waiting"
            " at once on this member; beyond it answered as if wait_ms were 0"
        ),
    )
    shutdown_grace_s: float = dataclasses.field(
        default=5.0,
        metadata=_doc("seconds running RPCs get to finish after SIGTERM before they are cancelled"),
    )
    health_check_interval_s: float = dataclasses.field(
        default=1.0, metadata=_doc("seconds between health re-checks (quorum, read barrier)")
    )
    # The leader's clock job (server/lease_ticker.py). 1 s: the log clock lags the leader's
    # time by at most this while nobody writes (commands sent to a follower are judged at it,
    # so their leases run up to this much longer), and expired resources are forgotten within
    # it; one TICK a second costs one log entry, and applying it costs what it expires
    # (core/expiry.py), not a pass over the resources.
    lease_tick_interval_s: float = dataclasses.field(
        default=1.0,
        metadata=_doc(
            "seconds between the leader's TICKs (advance the log clock, forget expired resources);"
            f" at most half of {raft_limits.STAMP_ADVANCE_MS_MAX / 1000:g} s, the most one stamp may advance it"
        ),
    )
    # -- Raft (see coordinator.raft.node.RaftConfig) ------------------------------------------
    raft_min_timeout_s: float = dataclasses.field(
        default=1.0, metadata=_doc("seconds: election timeout, lower bound")
    )
    raft_max_timeout_s: float = dataclasses.field(
        default=2.0, metadata=_doc("seconds: election timeout, upper bound")
    )
    leader_fallback_timeout_s: float = dataclasses.field(
        default=1.5, metadata=_doc("seconds an isolated leader keeps leading before it steps down")
    )
    # A leader's process that dies closes its connections and the followers see it at once;
    # standing after a few heartbeats then, instead of the 1-2 s election timeout, halves a
    # crashed leader's failover (coordinator/raft/RAFT.md, "A closed leader connection").
    leader_lost_election_s: float = dataclasses.field(
        default=0.3,
        metadata=_doc(
            "seconds: a follower whose connection to its leader closes stands for election after"
            " 1-2x this instead of its election timeout; 0: only after the election timeout"
        ),
    )
    heartbeat_s: float = dataclasses.field(default=0.1, metadata=_doc("seconds between leader heartbeats"))
    read_index: bool = dataclasses.field(
        default=True,
        metadata=_doc(
            "true: the leader answers Read and Describe by a read-index barrier (a heartbeat round"
            " a majority acknowledges, no log entry; RAFT.md \"Read-index reads\"); false: every"
            " read writes a READ_BARRIER entry. Set false on every member while any member runs a"
            " version without it (it refuses the round's field)"
        ),
    )
    # Lease reads rest on the voters' refusal to vote while they hear a live leader; the drift
    # bound is far above what NTP's slew of a monotonic clock can make of one vote window
    # (coordinator/raft/RAFT.md, "Lease reads").
    lease_reads: bool = dataclasses.field(
        default=True,
        metadata=_doc(
            "true (with read_index): a leader whose last confirmation round a majority acknowledged"
            " within its lease (the vote window, the smaller of raft_min_timeout_s and"
            " leader_lost_election_s, less lease_read_clock_drift_s) answers Read and Describe with no"
            " round trip; false: every such read takes a read-index round"
        ),
    )
    lease_read_clock_drift_s: float = dataclasses.field(
        default=0.05,
        metadata=_doc(
            "seconds the leader's monotonic clock may fall behind a voter's over one vote window;"
            " subtracted from the read lease"
        ),
    )
    commands_queue_size: int = dataclasses.field(
        default=10_000, metadata=_doc("commands queued for the Raft thread; beyond it OVERLOADED")
    )
    log_compaction_min_entries: int = dataclasses.field(
        # A snapshot runs on the Raft thread (~40 ms with a full dedup table): rarer is smoother.
        default=50_000, metadata=_doc("entries after which the log is snapshotted and compacted")
    )
    log_compaction_min_time_s: float = dataclasses.field(
        default=300.0, metadata=_doc("seconds after which the log is snapshotted and compacted")
    )
    log_compaction_min_bytes: int = dataclasses.field(
        # Bounds each member's journal memory and file whatever the write size (raft/limits.py).
        default=raft_limits.RAFT_COMPACTION_BYTES_DEFAULT,
        metadata=_doc(
            "bytes the Raft journal may grow by after its last compaction before the log is"
            " snapshotted and compacted (as well as by entries and seconds)"
        ),
    )
    initial_cluster_state: str = dataclasses.field(
        # Explicit, as in etcd: a member that was ever part of a cluster (or is added to one)
        # must not help start another by accident. "new" stays harmless after the first start:
        # a new cluster's first leader needs the vote of every initial member with an empty log,
        # and a member that kept the configuration never gives one (coordinator/raft/RAFT.md
        # "Member identity"), so the manifests set it and need no second edit.
        default="existing",
        metadata=_doc(
            "'new': while this member has no cluster configuration it may take part in bootstrapping"
            " a brand-new cluster (which needs every initial member, all empty; once any member kept"
            " the configuration, the unanimous rule refuses a re-bootstrap, so leaving it set is"
            " harmless); 'existing': it never helps bootstrap and, when empty, waits to be added"
            " (fencingctl admin member add/replace)"
        ),
    )
    member_id: str = dataclasses.field(
        # Only a member added to a running cluster at an address of its own needs one: the ids of
        # the initial members follow from their places in members (raft/membership.py).
        default="",
        metadata=_doc(
            "this member's id in the cluster configuration; empty: derived from its place among"
            " the initial members. A member added later (`fencingctl admin member add ID ADDRESS`)"
            " sets the id it was added under, with initial_cluster_state = 'existing' (the default)"
        ),
    )
    # -- tests ------------------------------------------------------------------------
    track_synced_for_tests: bool = dataclasses.field(
        default=False,
        metadata=_doc(
            "tests only: the journal records its synced length in a sidecar file, so a chaos"
            " run can simulate power loss (journal.cut_to_synced_length); costs one extra write per sync"
        ),
    )
    # -- observability --------------------------------------------------------------------
    metrics_address: str = dataclasses.field(
        default="",
        metadata=_doc(
            "host:port of the Prometheus endpoint (HTTP GET /metrics); empty: no metrics, and no cost"
        ),
    )
    metrics_connections_max: int = dataclasses.field(
        # A scrape is one connection for a fraction of a second; 16 lets a few Prometheus
        # servers and a curl or two in at once, and bounds what a flood can hold.
        default=16,
        metadata=_doc(
            "connections the metrics endpoint holds at once; one beyond it is closed as soon as"
            " it is accepted"
        ),
    )
    metrics_request_timeout_s: float = dataclasses.field(
        # A scrape of a member is a few ms; Prometheus' own scrape_timeout defaults to 10 s.
        default=5.0,
        metadata=_doc(
            "seconds a metrics connection has to send its request and take the whole reply;"
            " then it is closed, finished or not"
        ),
    )
    # -- process ------------------------------------------------------------------------
    log_level: str = dataclasses.field(
        default="INFO", metadata=_doc("DEBUG, INFO, WARNING or ERROR")
    )
    log_format: str = dataclasses.field(
        default="text",
        metadata=_doc(
            "text: one readable line per record; json: one JSON object per line with ts (UTC,"
            " ISO 8601), level, logger and msg, for log shippers"
        ),
    )
    cpu_affinity: str = dataclasses.field(
        default="auto",
        metadata=_doc(
            "CPU of this member's threads: 'auto' puts them on one of the CPUs it may use (its"
            " place in members, modulo their count) while it is the leader and frees them while"
            " it follows; a number puts them on that CPU always; 'off' leaves them to the OS. One"
            " CPU makes the GIL handoffs between gRPC and Raft threads cheap (coordinator/server/cpu_pin.py)"
        ),
    )

    # -- derived ----------------------------------------------------------------------------

    @property
    def member_map(self) -> dict[str, str]:
        """Raft address -> API address, for every member."""
        return dict(parse_member(m) for m in self.members)

    @property
    def member_index(self) -> int:
        """This member's place in ``members`` (0-based)."""
        return list(self.member_map).index(self.raft_address)

    def pinned_cpu(self) -> int | None:
        """The CPU ``cpu_affinity`` names on this machine (for ``auto``: the one used while
        leading); None: the OS places threads."""
        try:
            return cpu_pin.choose_cpu(self.cpu_affinity, self.member_index, cpu_pin.allowed_cpus())
        except cpu_pin.AffinityError as exc:
            raise ConfigError(f"cpu_affinity: {exc}") from exc

    @property
    def may_bootstrap(self) -> bool:
        """``initial_cluster_state`` as the Raft layer's bootstrap switch (RaftConfig.bootstrap)."""
        return self.initial_cluster_state == "new"

    @property
    def peer_addresses(self) -> tuple[str, ...]:
        return tuple(r for r in self.member_map if r != self.raft_address)

    @property
    def api_address(self) -> str:
        return self.member_map[self.raft_address]

    @property
    def bind_address(self) -> str:
        return self.listen_address or self.api_address

    @property
    def bind_setting(self) -> str:
        """The setting ``bind_address`` comes from, as an error line names it."""
        return "listen_address" if self.listen_address else "members: this member's API address"

    def resolved_admin_token(self) -> str:
        """The admin token from ``admin_token`` or ``admin_token_file``; "" if none."""
        if self.admin_token_file:
            return _secret_from_file("admin_token_file", self.admin_token_file, chars_min=1)
        return self.admin_token

    @property
    def raft_is_loopback(self) -> bool:
        """Only processes on this machine can reach the Raft port (a literal loopback address)."""
        return is_loopback_host(parse_address("raft_address", self.raft_address)[0])

    @property
    def api_is_loopback(self) -> bool:
        """Only processes on this machine can reach the API (it binds a literal loopback address)."""
        return is_loopback_host(parse_address(self.bind_setting, self.bind_address)[0])

    @property
    def peers_unauthenticated(self) -> bool:
        """No peer credential: any connection that names a member is taken for that member."""
        return not self.raft_secret_file

    def resolved_raft_secrets(self) -> tuple[str, ...]:
        """The Raft secrets from ``raft_secret_file``, the one to send with first; () if none.

        One secret per line, each stripped, blank lines skipped: a file of one line is the
        secret it always was (the same key, byte for byte). ConfigError naming the setting for
        an unreadable file, no secret, a short one, a duplicate or more than RAFT_SECRETS_MAX.
        """
        if not self.raft_secret_file:
            return ()
        path = self.raft_secret_file
        content = _secret_from_file("raft_secret_file", path, chars_min=1)
        secrets = tuple(line.strip() for line in content.splitlines() if line.strip())
        if len(secrets) > raft_limits.RAFT_SECRETS_MAX:
            raise ConfigError(
                f"raft_secret_file: {path} holds {len(secrets)} secrets; at most"
                f" {raft_limits.RAFT_SECRETS_MAX} (RAFT_SECRETS_MAX)"
            )
        for number, secret in enumerate(secrets, 1):
            if len(secret) < RAFT_SECRET_CHARS_MIN:
                raise ConfigError(
                    f"raft_secret_file: {path}: secret {number} holds {len(secret)} characters; use at"
                    f" least {RAFT_SECRET_CHARS_MIN} (e.g. openssl rand -hex 32)"
                )
            if secret in secrets[: number - 1]:
                # Harmless to the cipher, but a sign the file is not what the operator thinks.
                raise ConfigError(f"raft_secret_file: {path}: secret {number} repeats an earlier line")
        return secrets

    def tls_files(self) -> certs.TlsMaterial | None:
        """The API's TLS files, read and checked (certs.py); None: plaintext."""
        if not (self.tls_cert_file or self.tls_key_file or self.tls_client_ca_file):
            return None
        if not (self.tls_cert_file and self.tls_key_file):
            raise ConfigError("tls_cert_file and tls_key_file: give both (or neither, for plaintext)")
        try:
            return certs.read(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)
        except certs.CertificateError as exc:
            raise ConfigError(str(exc)) from None

    def proof_signer(self):
        """The ProofSigner of ``token_signing_key_file``; None without one."""
        if not self.token_signing_key_file:
            return None
        try:
            return ProofSigner.from_file(self.token_signing_key_file)
        except ProofError as exc:
            raise ConfigError(f"token_signing_key_file: {exc}") from exc

    def principals(self) -> list:
        """[(token sha256, Principal)] from ``principals_file``; [] without one."""
        if not self.principals_file:
            return []
        try:
            return load_principals(self.principals_file)
        except PrincipalsError as exc:
            raise ConfigError(f"principals_file: {exc}") from exc


# The Raft secret is stretched with PBKDF2 under a fixed salt by the Raft library
# (coordinator/raft/RAFT.md, "Not closed here"): only its own length protects it from guessing.
RAFT_SECRET_CHARS_MIN = 32


def _secret_from_file(key: str, path: str, *, chars_min: int) -> str:
    """The stripped content of ``path``; ConfigError naming ``key`` if unreadable or short."""
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc}") from exc
    if not secret:
        raise ConfigError(f"{key}: {path} is empty")
    if len(secret) < chars_min:
        raise ConfigError(
            f"{key}: {path} holds {len(secret)} characters; use at least {chars_min} (e.g. openssl rand -hex 32)"
        )
    return secret


def is_loopback_host(host: str) -> bool:
    """``host`` is "localhost" or a literal loopback IP. Any other name counts as reachable from
    the network: what it resolves to can change, and config checks never touch DNS."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_address(key: str, value: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); ConfigError naming ``key`` otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: {value!r} is not HOST:PORT with a port in 1-65535")
    return host, int(port)


def parse_member(value: str) -> tuple[str, str]:
    """``RAFT_HOST:PORT=API_HOST:PORT`` as (raft, api); ConfigError naming ``members`` otherwise."""
    raft, sep, api = value.partition("=")
    if not sep:
        raise ConfigError(f"members: {value!r} is not RAFT_HOST:PORT=API_HOST:PORT")
    parse_address("members", raft)
    parse_address("members", api)
    return raft, api

