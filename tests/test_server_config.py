"""``fencingd serve`` configuration: TOML plus flags, every bad key named; the error table."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from coordinator.core.names import ErrorReason as R
from coordinator.core.state_machine import Reason, Rejected
from coordinator.raft.interface import ProposeFailure, ProposeResult
from coordinator.server import config, errors, settings
from coordinator.server.fencingd import build_parser

MEMBERS = ["127.0.0.2:7000=127.0.0.2:7100", "127.0.0.3:7000=127.0.0.3:7100", "127.0.0.4:7000=127.0.0.4:7100"]


def write_toml(tmp_path, text: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def parse(argv):
    return config.from_args(build_parser().parse_args(["serve", *argv]))


GOOD = (
    'data_dir = "/tmp/x"\nraft_address = "127.0.0.3:7000"\n'
    'members = ["127.0.0.2:7000=127.0.0.2:7100", "127.0.0.3:7000=127.0.0.3:7100", '
    '"127.0.0.4:7000=127.0.0.4:7100"]\n'
)


def test_toml_file_with_flag_overrides(tmp_path):
    cfg = parse(["--config", write_toml(tmp_path, GOOD + "inflight_proposals_max = 7\n"),
                 "--propose-timeout-max-s", "2.5"])
    assert cfg.inflight_proposals_max == 7 and cfg.propose_timeout_max_s == 2.5
    assert cfg.api_address == "127.0.0.3:7100" == cfg.bind_address
    assert cfg.peer_addresses == ("127.0.0.2:7000", "127.0.0.4:7000")
    assert cfg.member_map["127.0.0.4:7000"] == "127.0.0.4:7100"


def test_flags_alone(tmp_path):
    cfg = parse(["--data-dir", str(tmp_path), "--raft-address", "127.0.0.2:7000", "--members", ",".join(MEMBERS),
                 "--listen-address", "0.0.0.0:7100", "--insecure-api", "true"])
    assert cfg.bind_address == "0.0.0.0:7100" and cfg.api_address == "127.0.0.2:7100"


def test_leader_lost_election_can_be_off(tmp_path):
    assert parse(["--config", write_toml(tmp_path, GOOD + "leader_lost_election_s = 0\n")]).leader_lost_election_s == 0
    assert parse(["--config", write_toml(tmp_path, GOOD)]).leader_lost_election_s == 0.3


@pytest.mark.parametrize("extra, message", [
    ("colour = 'blue'\n", "unknown key(s) colour"),
    ("inflight_proposals_max = 'many'\n", "inflight_proposals_max: must be an integer"),
    ("inflight_proposals_max = 0\n", "inflight_proposals_max: must be > 0"),
    ("propose_timeout_max_s = true\n", "propose_timeout_max_s: must be a number"),
    ("raft_min_timeout_s = 3.0\n", "raft_min_timeout_s: must be below raft_max_timeout_s"),
    ("leader_lost_election_s = 0.05\n", "leader_lost_election_s: 0.05 must be 0 (off), or at least heartbeat_s (0.1)"),
    ("leader_lost_election_s = 1.0\n", "and below raft_min_timeout_s (1)"),
    ("leader_lost_election_s = -0.3\n", "leader_lost_election_s: -0.3 must be 0 (off)"),
    ("lease_read_clock_drift_s = 0.3\n", "lease_read_clock_drift_s: 0.3 must be at least 0 and below 0.3"),
    ("lease_read_clock_drift_s = -0.01\n", "lease_read_clock_drift_s: -0.01 must be at least 0"),
    ("grpc_threads = 100\ngrpc_max_concurrent_rpcs = 10\n", "grpc_max_concurrent_rpcs: must be >= grpc_threads"),
    ("grpc_threads = 16\n", "streams_max: 16 must be below grpc_threads (16)"),
    ("grpc_threads = 26\n", "acquire_waiters_max: 8 plus streams_max (16) plus BACKUP_TRANSFERS_MAX (2) must be"
                             " below grpc_threads (26)"),
    ("acquire_waiters_per_principal_max = 0\n", "acquire_waiters_per_principal_max: must be > 0"),
    ("streams_per_principal_max = 0\n", "streams_per_principal_max: must be > 0"),
    ("stream_idle_timeout_s = -1\n", "stream_idle_timeout_s: must be > 0"),
    ("lease_tick_interval_s = 0\n", "lease_tick_interval_s: must be > 0"),
    ("lease_tick_interval_s = 1.5\n", "lease_tick_interval_s: 1.5 is above 1 (half the most one stamp"),
    ("log_level = 'LOUD'\n", "log_level: must be one of"),
    ("admin_token = 'a'\nadmin_token_file = '/nonexistent'\n", "give one, not both"),
    ("admin_token_file = '/nonexistent/token'\n", "admin_token_file: cannot read"),
    ("listen_address = 'nowhere'\n", "listen_address: 'nowhere' is not HOST:PORT"),
])
def test_bad_values_are_named(tmp_path, extra, message):
    with pytest.raises(config.ConfigError, match=None) as caught:
        parse(["--config", write_toml(tmp_path, GOOD + extra)])
    assert message in str(caught.value)


@pytest.mark.parametrize("text, message", [
    ('raft_address = "127.0.0.2:7000"\nmembers = []\n', "data_dir: required"),
    ('data_dir = "/x"\nmembers = ["127.0.0.2:7000=127.0.0.2:7100"]\n', "raft_address: required"),
    ('data_dir = "/x"\nraft_address = "127.0.0.9:7000"\nmembers = ["127.0.0.2:7000=127.0.0.2:7100"]\n',
     "must include this member's raft_address"),
    ('data_dir = "/x"\nraft_address = "127.0.0.2:7000"\n'
     'members = ["127.0.0.2:7000=127.0.0.2:7100", "127.0.0.3:7000=127.0.0.3:7100"]\n', "use an odd number"),
    ('data_dir = "/x"\nraft_address = "127.0.0.2:7000"\nmembers = ["127.0.0.2:7000"]\n',
     "is not RAFT_HOST:PORT=API_HOST:PORT"),
    ('data_dir = "/x"\nraft_address = "127.0.0.2:7000"\nmembers = [\n', "not valid TOML"),
])
def test_missing_or_inconsistent_cluster_is_refused(tmp_path, text, message):
    with pytest.raises(config.ConfigError) as caught:
        parse(["--config", write_toml(tmp_path, text)])
    assert message in str(caught.value)


def test_initial_cluster_state_defaults_to_existing_so_an_empty_member_never_bootstraps(tmp_path):
    default = parse(["--config", write_toml(tmp_path, GOOD)])
    assert default.initial_cluster_state == "existing" and not default.may_bootstrap
    new = parse(["--config", write_toml(tmp_path, GOOD + 'initial_cluster_state = "new"\n')])
    assert new.initial_cluster_state == "new" and new.may_bootstrap
    # The flag wins over the file, both ways.
    assert not parse(["--config", write_toml(tmp_path, GOOD + 'initial_cluster_state = "new"\n'),
                      "--initial-cluster-state", "existing"]).may_bootstrap
    assert parse(["--config", write_toml(tmp_path, GOOD), "--initial-cluster-state", "new"]).may_bootstrap


@pytest.mark.parametrize("value", ['"New"', '"true"', '""', "true"])
def test_a_bad_initial_cluster_state_is_one_line_naming_the_setting(tmp_path, value):
    with pytest.raises(config.ConfigError) as caught:
        parse(["--config", write_toml(tmp_path, GOOD + f"initial_cluster_state = {value}\n")])
    message = str(caught.value)
    assert message.startswith("initial_cluster_state: must be") and "\n" not in message


def test_the_raft_layer_gets_bootstrap_only_for_new(tmp_path):
    from coordinator.server.app import raft_config

    for state, bootstrap in (("new", True), ("existing", False)):
        cfg = parse(["--config", write_toml(tmp_path, GOOD), "--initial-cluster-state", state])
        assert raft_config(cfg).bootstrap is bootstrap


def test_serve_exits_2_with_the_message(tmp_path):
    path = write_toml(tmp_path, GOOD + "colour = 'blue'\n")
    out = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown key(s) colour" in out.stderr


def test_the_dropped_acquire_wait_poll_ms_is_refused_as_an_unknown_key(tmp_path):
    # It had no effect since a waiting Acquire waits in the lock queue; 0.1.0 was never
    # released, so no config file needs it to load.
    path = write_toml(tmp_path, GOOD + "acquire_wait_poll_ms = 100\n")
    with pytest.raises(config.ConfigError) as caught:
        parse(["--config", path])
    assert str(caught.value) == f"config file {path}: unknown key(s) acquire_wait_poll_ms"
    out = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"fencingd: configuration error: config file {path}: unknown key(s) acquire_wait_poll_ms"]


def test_every_refusal_reason_has_one_status():
    for reason in Reason:
        code, name = errors.STATUS_TABLE[reason]
        assert isinstance(code, grpc.StatusCode) and name
    for failure in errors.Failure:
        assert failure in errors.STATUS_TABLE


@pytest.mark.parametrize("failure, code, reason", [
    (ProposeFailure.LEADER_CHANGED, grpc.StatusCode.ABORTED, R.OUTCOME_UNKNOWN),
    (ProposeFailure.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED, R.OUTCOME_UNKNOWN),
    (ProposeFailure.NO_LEADER, grpc.StatusCode.UNAVAILABLE, R.NO_LEADER),
    (ProposeFailure.NOT_LEADER, grpc.StatusCode.UNAVAILABLE, R.NO_LEADER),
    (ProposeFailure.QUEUE_FULL, grpc.StatusCode.RESOURCE_EXHAUSTED, R.OVERLOADED),
    (ProposeFailure.COMMAND_TOO_LARGE, grpc.StatusCode.RESOURCE_EXHAUSTED, R.LIMIT_EXCEEDED),
])
def test_propose_failures_map_through_the_table(failure, code, reason):
    error = errors.from_propose_failure(ProposeResult.failed(failure), "10.0.0.1:7000", "10.0.0.1:7100")
    assert (error.code, error.reason) == (code, reason)
    if reason == R.NO_LEADER:
        assert error.metadata["leader_api"] == "10.0.0.1:7100"
    if reason == R.OUTCOME_UNKNOWN:
        assert error.metadata["detail"] == failure.value


def test_refusal_details_become_string_metadata():
    refusal = Rejected(op=None, reason=Reason.LEASE_HELD, message="held",
                       details={"holder": "a", "expires_at_ms": 12, "token": 3})
    error = errors.from_refusal(refusal, index=9)
    assert (error.code, error.reason, error.index) == (grpc.StatusCode.FAILED_PRECONDITION, R.LEASE_HELD, 9)
    assert error.metadata == {"holder": "a", "expires_at_ms": "12", "token": "3"}
    status = errors.rich_status(error, (("fencing-member-id", "m"),))
    assert status.code is grpc.StatusCode.FAILED_PRECONDITION
    assert ("fencing-member-id", "m") in status.trailing_metadata


# -- peer credential (SECURITY.md, "Peer authentication") -------------------------------------

PUBLIC_API = ('data_dir = "/tmp/x"\nraft_address = "10.0.0.2:7000"\n'
              'members = ["10.0.0.1:7000=10.0.0.1:7100", "10.0.0.2:7000=10.0.0.2:7100",'
              ' "10.0.0.3:7000=10.0.0.3:7100"]\n')
# The peer side's tests: the API's own check (below) is satisfied explicitly.
PUBLIC = PUBLIC_API + "insecure_api = true\n"


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.4", True), ("localhost", True), ("[::1]", True),
    ("10.0.0.1", False), ("0.0.0.0", False), ("node1", False), ("fencing-0.fencing-peers.fencing.svc", False),
])
def test_only_literal_loopback_counts_as_loopback(host, loopback):
    assert settings.is_loopback_host(host) is loopback


def test_a_public_raft_address_without_the_secret_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(config.ConfigError) as caught:
        parse(["--config", write_toml(tmp_path, PUBLIC)])
    message = str(caught.value)
    assert message.startswith("raft_secret_file: required because raft_address 10.0.0.2:7000 is not loopback")
    assert "fencingd gen-secret" in message and "insecure_peer_transport" in message and "\n" not in message


def test_a_public_raft_address_runs_with_the_secret_or_the_explicit_insecure_flag(tmp_path):
    secret = tmp_path / "raft-secret"
    secret.write_text("x" * 64)
    assert parse(["--config", write_toml(tmp_path, PUBLIC), "--raft-secret-file", str(secret)]).raft_secret_file
    insecure = parse(["--config", write_toml(tmp_path, PUBLIC + "insecure_peer_transport = true\n")])
    assert insecure.insecure_peer_transport and insecure.peers_unauthenticated
    assert not parse(["--config", write_toml(tmp_path, GOOD)]).insecure_peer_transport  # loopback: no flag needed
    with pytest.raises(config.ConfigError, match="^insecure_peer_transport: true, but raft_secret_file is set"):
        parse(["--config", write_toml(tmp_path, PUBLIC + "insecure_peer_transport = true\n"),
               "--raft-secret-file", str(secret)])


def serve(config_path: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", config_path],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_serve_without_the_secret_on_a_public_address_exits_2_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config",
                          write_toml(tmp_path, PUBLIC)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("fencingd: configuration error: raft_secret_file: required")


def test_insecure_peer_transport_starts_and_warns_at_every_start(tmp_path):
    from testsupport.supervisor import pick_ports

    raft_port, api_port = pick_ports(("127.0.0.1",))
    members = [f"0.0.0.0:{raft_port}=127.0.0.1:{api_port}",  # 0.0.0.0: every interface, not loopback
               "0.0.0.0:1=127.0.0.1:2", "0.0.0.0:3=127.0.0.1:4"]
    path = write_toml(tmp_path, f'data_dir = "{tmp_path / "d"}"\nraft_address = "{members[0].split("=")[0]}"\n'
                                f"members = {members!r}\ninsecure_peer_transport = true\n".replace("'", '"'))
    starts_warning_each_time(path, "insecure_peer_transport")


def starts_warning_each_time(path: str, setting: str) -> None:
    """The member of ``path`` starts (READY), and warns naming ``setting`` at every start."""
    for _ in range(2):  # every start, not only the first
        proc = serve(path)
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("READY "):
                    break
            assert any("WARNING" in printed and setting in printed for printed in lines), "".join(lines)
            assert lines[-1].startswith("READY "), "".join(lines)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


# -- the API's callers (SECURITY.md, "An API open to the network") ------------------------------

SECRET_LINE = 'raft_secret_file = "{}"\n'


def public_api(tmp_path, extra: str = "") -> str:
    """PUBLIC_API with its peer credential, so only the API's own check is left to pass."""
    secret = tmp_path / "raft-secret"
    secret.write_text("x" * 64)
    return write_toml(tmp_path, PUBLIC_API + SECRET_LINE.format(secret) + extra)


@pytest.mark.parametrize("extra, admin_open", [("", True), ('admin_token = "t"\n', False)])
def test_an_api_open_to_the_network_is_refused_naming_insecure_api(tmp_path, extra, admin_open):
    """The finding: an API on 0.0.0.0 with no TLS, no principals and no admin token started
    with a warning, and an anonymous MemberRemove removed a voter. An admin token alone is not
    enough either: the data plane would stay open to whoever reaches the port."""
    with pytest.raises(config.ConfigError) as caught:
        parse(["--config", public_api(tmp_path, extra)])
    message = str(caught.value)
    assert message.startswith("insecure_api: the API listens on 10.0.0.2:7100, not loopback") and "\n" not in message
    assert "principals_file" in message and "insecure_api = true" in message
    assert ("call Admin" in message) is admin_open
    with pytest.raises(config.ConfigError, match="^insecure_api: the API listens on 0.0.0.0:7100"):
        parse(["--config", public_api(tmp_path, extra), "--listen-address", "0.0.0.0:7100"])


def test_an_api_open_to_the_network_runs_with_callers_known_or_the_explicit_insecure_flag(tmp_path):
    principals = tmp_path / "principals.toml"
    principals.write_text(f'[[principal]]\nname = "a"\ntoken_sha256 = "{"0" * 64}"\nprefixes = ["a/"]\n')
    assert parse(["--config", public_api(tmp_path), "--principals-file", str(principals)]).principals_file
    # client certificates (mutual TLS) know every caller too; the files are not read here
    mtls = config.build(config.read_toml(public_api(tmp_path, 'tls_cert_file = "c"\ntls_key_file = "k"\n'
                                                             'tls_client_ca_file = "ca"\n')), {}, read_files=False)
    assert mtls.tls_client_ca_file and not mtls.insecure_api
    assert parse(["--config", public_api(tmp_path, "insecure_api = true\n")]).insecure_api
    loopback = parse(["--config", public_api(tmp_path), "--listen-address", "127.0.0.1:7100"])
    assert loopback.api_is_loopback and not loopback.insecure_api  # loopback: no flag needed
    with pytest.raises(config.ConfigError, match="^insecure_api: true, but principals_file or tls_client_ca_file"):
        parse(["--config", public_api(tmp_path, "insecure_api = true\n"), "--principals-file", str(principals)])


def test_serve_with_an_open_api_on_a_public_address_exits_2_with_one_line(tmp_path):
    from testsupport.supervisor import pick_ports

    raft_port, api_port = pick_ports(("127.0.0.1",))
    path = write_toml(tmp_path, f'data_dir = "{tmp_path / "d"}"\nraft_address = "127.0.0.1:{raft_port}"\n'
                                f'members = ["127.0.0.1:{raft_port}=127.0.0.1:{api_port}"]\n'
                                f'listen_address = "0.0.0.0:{api_port}"\n')
    out = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config", path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "READY" not in out.stdout
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"fencingd: configuration error: insecure_api: the API listens on 0.0.0.0:{api_port}")
    with open(path, "a", encoding="utf-8") as f:
        f.write("insecure_api = true\ninitial_cluster_state = \"new\"\ncpu_affinity = \"off\"\n")
    starts_warning_each_time(path, "insecure_api")
