"""Whether a ``ServerConfig`` is usable: every check, in one fixed order.

Owns: ``validate`` and its checks -- required settings, addresses, positive values, timings
against each other, connection and thread budgets, the choices a setting takes, the peer and
API credentials a network-facing member needs -- and, unless told not to, reading every file
the settings name, so a bad one fails at start. A config with several faults always hears of
the same one first.
Must never: change a setting, start anything, open sockets or touch the data directory.
"""

from __future__ import annotations

from coordinator.core import limits as core_limits
from coordinator.raft import limits as raft_limits
from coordinator.server.settings import ConfigError, ServerConfig, parse_address, parse_member

# gRPC takes its connection timeouts as a 32-bit count of milliseconds (about 24 days); a day
# is far more than any useful handshake, idle or scrape timeout, and keeps infinity out.
CONNECTION_TIMEOUT_S_MAX = 86_400.0

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
INITIAL_CLUSTER_STATES = ("new", "existing")
LOG_FORMATS = ("text", "json")

# Settings that must be > 0 (validate).
_POSITIVE = (
    "propose_timeout_max_s",
    "inflight_proposals_max",
    "grpc_threads",
    "grpc_max_concurrent_rpcs",
    "streams_max",
    "streams_per_principal_max",
    "stream_idle_timeout_s",
    "watchers_per_principal_max",
    "acquire_waiters_max",
    "acquire_waiters_per_principal_max",
    "health_check_interval_s",
    "lease_tick_interval_s",
    "raft_min_timeout_s",
    "raft_max_timeout_s",
    "leader_fallback_timeout_s",
    "heartbeat_s",
    "refused_log_window_s",
    "commands_queue_size",
    "log_compaction_min_entries",
    "log_compaction_min_time_s",
    "log_compaction_min_bytes",
    "api_connections_max",
    "api_connections_per_peer_max",
    "api_handshake_timeout_s",
    "api_connection_idle_s",
    "metrics_connections_max",
    "metrics_request_timeout_s",
)


def validate(config: ServerConfig, *, read_files: bool = True) -> ServerConfig:
    """Return ``config`` if every field is usable, else raise ConfigError naming the key.
    ``read_files`` False: the values only, not the files they name nor this machine's CPUs
    (``fencingd check-config --values-only``, for a config meant for another machine).
    The checks keep one order, so a config with several faults always hears of the same one first."""
    _check_cluster(config)
    _check_listen_addresses(config)
    if config.admin_token and config.admin_token_file:
        raise ConfigError("admin_token and admin_token_file: give one, not both")
    for key in _POSITIVE:
        value = getattr(config, key)
        if not value > 0:
            raise ConfigError(f"{key}: must be > 0, got {value}")
    _check_timing(config)
    _check_connection_limits(config)
    _check_thread_budget(config)
    _check_choices(config)
    _check_peer_credential(config)
    _check_api_credential(config)
    if not read_files:
        return config
    config.resolved_admin_token()  # a missing or empty token file fails at start, not at first use
    config.principals()  # so does a bad principals file
    config.tls_files()  # and unreadable TLS files
    config.resolved_raft_secrets()  # and a missing or short Raft secret, or too many
    config.proof_signer()  # and a token signing key that is not an Ed25519 private key
    config.pinned_cpu()  # and a CPU this machine does not let us use
    return config


def _check_cluster(config: ServerConfig) -> None:
    """data_dir, this member's Raft address and member id, and the member list it is in."""
    if not config.data_dir:
        raise ConfigError("data_dir: required")
    if not config.raft_address:
        raise ConfigError("raft_address: required")
    parse_address("raft_address", config.raft_address)
    if not config.members:
        raise ConfigError("members: required (every member as RAFT=API, this one included)")
    parsed = [parse_member(m) for m in config.members]
    rafts = [r for r, _ in parsed]
    if len(set(rafts)) != len(rafts):
        raise ConfigError("members: a Raft address is listed twice")
    if config.raft_address not in rafts:
        raise ConfigError(f"members: must include this member's raft_address {config.raft_address}")
    if len(rafts) % 2 == 0:
        raise ConfigError(
            f"members: {len(rafts)} members; use an odd number (a majority of an even count buys nothing)")
    if config.member_id and (len(config.member_id) > raft_limits.RAFT_MEMBER_ID_CHARS_MAX
                             or not config.member_id.isprintable() or " " in config.member_id):
        raise ConfigError("member_id: 1 to RAFT_MEMBER_ID_CHARS_MAX printable characters, no spaces")


def _check_listen_addresses(config: ServerConfig) -> None:
    """listen_address and metrics_address: HOST:PORT each, metrics on a port of its own."""
    if config.listen_address:
        parse_address("listen_address", config.listen_address)
    if config.metrics_address:
        metrics = parse_address("metrics_address", config.metrics_address)
        taken = {"raft_address": config.raft_address, "the gRPC address": config.bind_address}
        for what, address in taken.items():
            if parse_address(what, address) == metrics:
                raise ConfigError(f"metrics_address: {config.metrics_address} is also {what}")


def _check_timing(config: ServerConfig) -> None:
    """Margins, the lease tick against the log clock, and the election timings against each other."""
    if config.propose_deadline_margin_s < 0 or config.shutdown_grace_s < 0:
        raise ConfigError("propose_deadline_margin_s and shutdown_grace_s: must be >= 0")
    if config.lease_tick_interval_s * 1000 * 2 > raft_limits.STAMP_ADVANCE_MS_MAX:
        # A TICK late by up to one more interval still stamps within the bound, or the log
        # clock would lose the excess and an idle cluster's leases would run long.
        raise ConfigError(
            f"lease_tick_interval_s: {config.lease_tick_interval_s} is above"
            f" {raft_limits.STAMP_ADVANCE_MS_MAX / 2000:g} (half the most one stamp may advance the log clock)"
        )
    if config.raft_min_timeout_s >= config.raft_max_timeout_s:
        raise ConfigError("raft_min_timeout_s: must be below raft_max_timeout_s")
    if config.raft_min_timeout_s <= 3 * config.heartbeat_s:
        raise ConfigError("raft_min_timeout_s: must exceed 3 * heartbeat_s")
    if config.leader_lost_election_s and not (
        config.heartbeat_s <= config.leader_lost_election_s < config.raft_min_timeout_s
    ):
        raise ConfigError(
            f"leader_lost_election_s: {config.leader_lost_election_s} must be 0 (off), or at least"
            f" heartbeat_s ({config.heartbeat_s:g}) and below raft_min_timeout_s ({config.raft_min_timeout_s:g})"
        )
    window = min(config.raft_min_timeout_s, config.leader_lost_election_s or config.raft_min_timeout_s)
    if config.lease_reads and not (0 <= config.lease_read_clock_drift_s < window):
        # The lease lasts the vote window minus this bound (RAFT.md "Lease reads"): it must be left positive.
        raise ConfigError(
            f"lease_read_clock_drift_s: {config.lease_read_clock_drift_s} must be at least 0 and below {window:g}"
            " (the vote window: the smaller of raft_min_timeout_s and a nonzero leader_lost_election_s)"
        )


def _check_connection_limits(config: ServerConfig) -> None:
    """The API connection caps against each other, and the connection timeouts' ceiling."""
    if config.api_connections_per_peer_max > config.api_connections_max:
        raise ConfigError(
            f"api_connections_per_peer_max: {config.api_connections_per_peer_max} is above"
            f" api_connections_max ({config.api_connections_max})"
        )
    for key in ("api_handshake_timeout_s", "api_connection_idle_s", "metrics_request_timeout_s"):
        if getattr(config, key) > CONNECTION_TIMEOUT_S_MAX:
            raise ConfigError(f"{key}: {getattr(config, key)} is above {CONNECTION_TIMEOUT_S_MAX:g} s")


def _check_thread_budget(config: ServerConfig) -> None:
    """What may hold a gRPC worker thread for long leaves threads for health and Admin."""
    if config.grpc_max_concurrent_rpcs < config.grpc_threads:
        raise ConfigError("grpc_max_concurrent_rpcs: must be >= grpc_threads")
    if config.streams_max >= config.grpc_threads:
        raise ConfigError(
            f"streams_max: {config.streams_max} must be below grpc_threads ({config.grpc_threads}),"
            " or streams could hold every thread health and Admin need"
        )
    # Every call that can hold a worker thread for long: streams, waiting Acquires and Locks,
    # and backup transfers (a unary Restore may wait RESTORE_COMMIT_TIMEOUT_S_MAX).
    if config.streams_max + config.acquire_waiters_max + core_limits.BACKUP_TRANSFERS_MAX >= config.grpc_threads:
        raise ConfigError(
            f"acquire_waiters_max: {config.acquire_waiters_max} plus streams_max ({config.streams_max})"
            f" plus BACKUP_TRANSFERS_MAX ({core_limits.BACKUP_TRANSFERS_MAX}) must be below grpc_threads"
            f" ({config.grpc_threads}), or streams, waiting Acquires and backups could hold every"
            " thread health and Admin need"
        )


def _check_choices(config: ServerConfig) -> None:
    """Settings that take one of a few values, and the TLS files that come as a pair."""
    if config.initial_cluster_state not in INITIAL_CLUSTER_STATES:
        raise ConfigError(
            f"initial_cluster_state: must be 'new' (may help bootstrap a brand-new cluster) or"
            f" 'existing' (waits to be added), got {config.initial_cluster_state!r}"
        )
    if config.log_level.upper() not in _LOG_LEVELS:
        raise ConfigError(f"log_level: must be one of {', '.join(_LOG_LEVELS)}")
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format: must be one of {', '.join(LOG_FORMATS)}")
    if (config.tls_cert_file or config.tls_key_file or config.tls_client_ca_file) and not (
            config.tls_cert_file and config.tls_key_file):
        raise ConfigError("tls_cert_file and tls_key_file: give both (or neither, for plaintext)")


def _check_peer_credential(config: ServerConfig) -> None:
    """Members authenticate each other unless the Raft port is loopback-only or the operator
    said ``insecure_peer_transport`` (SECURITY.md, "Peer authentication")."""
    if config.raft_secret_file and config.insecure_peer_transport:
        raise ConfigError("insecure_peer_transport: true, but raft_secret_file is set; remove one")
    if config.raft_secret_file or config.insecure_peer_transport or config.raft_is_loopback:
        return
    raise ConfigError(
        f"raft_secret_file: required because raft_address {config.raft_address} is not loopback"
        " (create one with: fencingd gen-secret FILE, the same file on every member;"
        " insecure_peer_transport = true runs without, letting anyone who reaches the Raft port pose as a member)"
    )


def _check_api_credential(config: ServerConfig) -> None:
    """The API knows its callers -- principals (bearer tokens) or client certificates -- unless
    it listens on loopback only or the operator said ``insecure_api`` (SECURITY.md, "An API
    open to the network"). An admin token alone is not enough: the data plane stays open, and
    whoever reaches the port may take, release and write every resource (DESIGN I10)."""
    knows_callers = bool(config.principals_file or config.tls_client_ca_file)
    if knows_callers and config.insecure_api:
        raise ConfigError("insecure_api: true, but principals_file or tls_client_ca_file is set; remove one")
    if knows_callers or config.insecure_api or config.api_is_loopback:
        return
    raise ConfigError(
        f"insecure_api: the API listens on {config.bind_address}, not loopback, with no principals_file"
        " and no tls_client_ca_file, so anyone who reaches it may take, release and write every resource"
        f"{'' if config.admin_token or config.admin_token_file else ' and call Admin'}; set principals_file"
        " (README \"Who may call\") or insecure_api = true"
    )

