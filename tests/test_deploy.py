"""deploy/: every manifest runs the same entry point with a configuration fencingd accepts.

No Docker engine or Kubernetes cluster exists here, so these tests check what can go wrong
around them: each member's configuration goes through the real config loader, the members
of one cluster agree with each other and with the ports the manifests publish, and the
health command the images probe with answers right against a real gRPC health service.
"""

from __future__ import annotations

import concurrent.futures
import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.raft.fatal import EXIT_APPLY_FAILED, EXIT_DISK_FAILED
from coordinator.server import config as config_mod
from coordinator.server.fencingd import build_parser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(REPO, "deploy")
CONFIG_PATH = "/etc/fencing/fencing.toml"
RAFT_PORT, API_PORT, METRICS_PORT = 7000, 7100, 7300


def secret_files(tmp_path) -> dict[str, str]:
    """Real files in place of the secrets the manifests mount only at run time."""
    token, raft_secret = tmp_path / "admin-token", tmp_path / "raft-secret"
    token.write_text("t0ken")
    raft_secret.write_text("0123456789abcdef" * 4)
    return {"admin_token_file": str(token), "raft_secret_file": str(raft_secret)}


def load_member(values: dict, tmp_path) -> config_mod.ServerConfig:
    """The config a member would run with, its secret files replaced by real ones."""
    assert values.get("admin_token_file"), "every deployed member needs an admin token"
    assert values.get("raft_secret_file"), "every deployed member needs the peer credential"
    assert not values.get("insecure_peer_transport")
    return config_mod.build(values, secret_files(tmp_path))


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def check_cluster(configs: list[config_mod.ServerConfig]) -> None:
    """Members agree: one member list, each one in it once, ports as the manifests publish."""
    assert len(configs) == 3
    assert len({c.members for c in configs}) == 1, "every member must list the same members"
    assert sorted(c.raft_address for c in configs) == sorted(configs[0].member_map)
    for c in configs:
        assert port(c.raft_address) == RAFT_PORT
        assert port(c.api_address) == port(c.bind_address) == API_PORT
        assert port(c.metrics_address) == METRICS_PORT
        assert c.data_dir.startswith("/var/lib/fencing/")
        # The three start empty together and must bootstrap with no manual step (deploy/README.md).
        assert c.initial_cluster_state == "new"


# -- Dockerfile -------------------------------------------------------------------------------


def dockerfile() -> dict[str, list[str]]:
    """Instruction -> arguments of every line (continuations joined)."""
    with open(os.path.join(DEPLOY, "Dockerfile"), encoding="utf-8") as f:
        text = re.sub(r"\\\n", " ", f.read())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.setdefault(word.upper(), []).append(rest.strip())
    return out


def test_the_image_runs_fencingd_serve_on_a_mounted_config_as_a_non_root_user():
    d = dockerfile()
    assert yaml.safe_load(d["ENTRYPOINT"][-1]) == ["fencingd", "serve"]
    assert yaml.safe_load(d["CMD"][-1]) == ["--config", CONFIG_PATH]
    assert {int(p) for p in d["EXPOSE"][-1].split()} == {RAFT_PORT, API_PORT, METRICS_PORT}
    assert d["USER"][-1] not in ("root", "0")
    assert "fencingd" in d["HEALTHCHECK"][-1] and "health" in d["HEALTHCHECK"][-1]
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["fencingd"] == "coordinator.server.fencingd:main"
    for copy in d["COPY"]:
        for source in copy.split()[:-1]:
            assert os.path.exists(os.path.join(REPO, source)), f"COPY {source}: not in the repository"


# -- docker compose ---------------------------------------------------------------------------


def test_compose_members_form_one_cluster_on_the_published_ports(tmp_path):
    with open(os.path.join(DEPLOY, "compose.yaml"), encoding="utf-8") as f:
        compose = yaml.safe_load(f)
    services = compose["services"]
    assert sorted(services) == ["node1", "node2", "node3"]
    configs = []
    for name, service in services.items():
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert service["command"] == ["--config", CONFIG_PATH]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}  # target -> source
        source = mounts[CONFIG_PATH]
        with open(os.path.join(DEPLOY, source), "rb") as f:
            values = tomllib.load(f)
        config = load_member(values, tmp_path)
        assert config.raft_address.split(":")[0] == service["hostname"] == name
        assert values["admin_token_file"] == "/run/secrets/admin_token"
        assert values["raft_secret_file"] == "/run/secrets/raft_secret"
        assert service["secrets"] == ["admin_token", "raft_secret"]
        published = {int(p.rsplit(":", 1)[1]) for p in service["ports"]}
        assert published == {API_PORT, METRICS_PORT}
        assert mounts["/var/lib/fencing"] in compose["volumes"]
        configs.append(config)
    check_cluster(configs)
    assert compose["secrets"]["admin_token"]["file"] == "./compose/admin-token"
    assert compose["secrets"]["raft_secret"]["file"] == "./compose/raft-secret"


# -- Kubernetes -------------------------------------------------------------------------------


def downward_args(container: dict, pod: str, namespace: str) -> list[str]:
    """The container's args as Kubernetes expands them in pod ``pod`` of ``namespace``; every
    $(VAR) they use must come from the downward API (no hard-coded namespace or domain)."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    env = {e["name"]: fields[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container["env"]
           if "fieldRef" in e.get("valueFrom", {})}
    args = []
    for arg in container["args"]:
        for name in re.findall(r"\$\((\w+)\)", arg):
            assert name in env, f"{arg}: ${name} is not set from the downward API"
            arg = arg.replace(f"$({name})", env[name])
        assert "cluster.local" not in arg, f"{arg}: the cluster domain is the pod's DNS search list's"
        args.append(arg)
    return args


def test_kubernetes_members_get_valid_configs_and_probes_match_the_ports(tmp_path):
    with open(os.path.join(DEPLOY, "kubernetes", "fencing.yaml"), encoding="utf-8") as f:
        docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(f)}
    sts = docs[("StatefulSet", "fencing")]
    replicas = sts["spec"]["replicas"]
    assert replicas == 3
    peers = docs[("Service", sts["spec"]["serviceName"])]
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True
    assert docs[("PodDisruptionBudget", "fencing")]["spec"]["minAvailable"] == replicas // 2 + 1
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container.get("command") is None, "the image's entry point (fencingd serve) must run"
    configs = []
    for i in range(replicas):
        pod = f"{sts['metadata']['name']}-{i}"
        args = downward_args(container, pod, "ns-under-test")
        parsed = build_parser().parse_args(["serve", *args])
        values = {k: v for k, v in vars(parsed).items() if k in config_mod._FIELDS and v is not None}
        config = load_member(values, tmp_path)
        # The namespace the pod runs in, and no cluster domain: the pod's DNS search list has it.
        assert config.raft_address == f"{pod}.{peers['metadata']['name']}.ns-under-test.svc:{RAFT_PORT}"
        assert all(".ns-under-test.svc:" in m for m in config.members)
        configs.append(config)
    check_cluster(configs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"raft": RAFT_PORT, "grpc": API_PORT, "metrics": METRICS_PORT}
    assert container["readinessProbe"]["grpc"]["port"] == API_PORT  # grpc.health.v1
    assert "grpc" not in container["livenessProbe"], "a partitioned member must not be restarted"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert configs[0].data_dir.startswith(mounts["data"])
    assert any(a.startswith("--admin-token-file=" + mounts["admin"]) for a in container["args"])
    # The peer credential comes from a Secret, and only members reach the Raft port.
    assert any(a.startswith("--raft-secret-file=" + mounts["raft"] + "/") for a in container["args"])
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["raft"]["secret"]["secretName"] == "fencing-raft"
    policy = docs[("NetworkPolicy", "fencing-raft")]["spec"]
    members = sts["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"] == members and policy["policyTypes"] == ["Ingress"]
    raft_rules = [r for r in policy["ingress"] if any(p["port"] == RAFT_PORT for p in r.get("ports", []))]
    assert raft_rules and all(r.get("from") == [{"podSelector": {"matchLabels": members}}] for r in raft_rules)


INSTANCE_LABEL = "app.kubernetes.io/instance"


def selectors(docs: list[dict]) -> dict[str, dict[str, str]]:
    """Every label selector in the manifest, by where it is (Services, NetworkPolicy, PDB,
    StatefulSet, anti-affinity): what picks the pods of this install."""
    out = {}
    for d in docs:
        where, spec = f"{d['kind']} {d['metadata']['name']}", d["spec"]
        if d["kind"] == "Service":
            out[where] = spec["selector"]
        elif d["kind"] == "NetworkPolicy":
            out[where] = spec["podSelector"]["matchLabels"]
            for i, rule in enumerate(spec["ingress"]):
                for j, peer in enumerate(rule.get("from", [])):
                    out[f"{where} ingress[{i}].from[{j}]"] = peer["podSelector"]["matchLabels"]
        elif d["kind"] in ("PodDisruptionBudget", "StatefulSet"):
            out[where] = spec["selector"]["matchLabels"]
        if d["kind"] == "StatefulSet":
            anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
            terms = anti["requiredDuringSchedulingIgnoredDuringExecution"]
            for i, term in enumerate(terms):
                out[f"{where} podAntiAffinity[{i}]"] = term["labelSelector"]["matchLabels"]
    return out


def another_install(docs: list[dict], instance: str) -> list[dict]:
    """The manifest as a second install in the same namespace: its instance label's value changed."""
    text = yaml.safe_dump_all(docs)
    return list(yaml.safe_load_all(text.replace(f"{INSTANCE_LABEL}: fencing", f"{INSTANCE_LABEL}: {instance}")))


def pod_labels(docs: list[dict]) -> dict[str, str]:
    return next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["metadata"]["labels"]


def test_two_kubernetes_installs_in_one_namespace_select_only_their_own_pods():
    docs = kubernetes_docs()
    mine = pod_labels(docs)
    assert mine.get(INSTANCE_LABEL) and mine.get("app.kubernetes.io/name") == "fencing"
    found = selectors(docs)
    assert len(found) == 7, sorted(found)  # 2 Services, NetworkPolicy (+ its peers), PDB, StatefulSet, affinity
    for where, selector in found.items():
        assert selector.items() <= mine.items(), f"{where}: {selector} does not select this install's pods"
        assert selector.get(INSTANCE_LABEL) == mine[INSTANCE_LABEL], f"{where}: no {INSTANCE_LABEL}"
    theirs = pod_labels(another_install(docs, "fencing-b"))
    for where, selector in found.items():
        assert not selector.items() <= theirs.items(), f"{where} selects the other install's pods too"
    for d in docs:
        assert d["metadata"]["labels"].items() >= {INSTANCE_LABEL: mine[INSTANCE_LABEL]}.items(), d["metadata"]["name"]


def test_the_selector_check_refuses_the_manifest_with_the_app_label_only():
    docs = kubernetes_docs()
    text = yaml.safe_dump_all(docs).replace(f"{INSTANCE_LABEL}: fencing", "")
    old = list(yaml.safe_load_all(text.replace(", }", "}")))
    theirs = pod_labels(another_install(old, "fencing-b"))
    assert all(selector.items() <= theirs.items() for selector in selectors(old).values())


def quantity_bytes(value: str) -> int:
    """A Kubernetes quantity (``3Gi``, ``512Mi``, ``2G``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    m = re.fullmatch(r"(\d+)([KMGT]i?)?", str(value))
    assert m, f"not a quantity: {value}"
    return int(m.group(1)) * units.get(m.group(2) or "", 1)


def documented(pattern: str, path: str = "README.md") -> re.Match:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        m = re.search(pattern, re.sub(r"\s+", " ", f.read()))
    assert m, f"{path} no longer says {pattern!r}"
    return m


def test_kubernetes_memory_and_volume_fit_the_documented_figures():
    from coordinator.core.limits import BACKUP_BYTES_MAX
    from coordinator.raft.limits import RAFT_COMPACTION_BYTES_DEFAULT

    sts = next(d for d in kubernetes_docs() if d["kind"] == "StatefulSet")
    resources = sts["spec"]["template"]["spec"]["containers"][0]["resources"]
    # README "Performance": a member's RSS at the resource limit, snapshots included.
    rss_max = int(documented(r"each member holds (\d+)-(\d+) MiB").group(2)) * 2**20
    assert quantity_bytes(resources["requests"]["memory"]) >= rss_max
    # A restore builds the new state beside the old one, the backup's chunks staged meanwhile.
    assert quantity_bytes(resources["limits"]["memory"]) >= 2 * rss_max + BACKUP_BYTES_MAX
    claim = next(c for c in sts["spec"]["volumeClaimTemplates"] if c["metadata"]["name"] == "data")
    # The snapshot, the next one written beside it, a staged restore in the journal, and the
    # journal's growth between compactions with its compacted copy.
    needed = 3 * BACKUP_BYTES_MAX + 2 * RAFT_COMPACTION_BYTES_DEFAULT
    assert quantity_bytes(claim["spec"]["resources"]["requests"]["storage"]) >= needed


def test_kubernetes_gives_a_loading_member_time_before_liveness_and_says_membership_changes():
    docs = kubernetes_docs()
    container = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    startup = container["startupProbe"]
    # TCP like liveness: a member that has no quorum yet has started; only loading is waited for.
    assert startup["tcpSocket"]["port"] == API_PORT and "grpc" not in startup
    restart_s = float(documented(r"serves again [\d.]+-([\d.]+) s after its start").group(1))
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 10 * restart_s
    with open(os.path.join(DEPLOY, "kubernetes", "fencing.yaml"), encoding="utf-8") as f:
        header = f.read().split("\napiVersion:", 1)[0]
    assert "static" not in header, "membership changes through the log (RAFT.md 'Membership changes')"
    assert "fencingctl admin member" in header and '"Membership changes"' in header
    documented(r"## Membership changes ", "coordinator/raft/RAFT.md")


# -- systemd ----------------------------------------------------------------------------------


def test_the_systemd_unit_runs_the_example_config_and_stops_on_fatal_exits(tmp_path):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(os.path.join(DEPLOY, "systemd", "fencingd.service"))
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert os.path.basename(argv[0]) == "fencingd" and argv[1:] == ["serve", "--config", CONFIG_PATH]
    with open(os.path.join(DEPLOY, "systemd", "fencing.toml"), "rb") as f:
        config = load_member(tomllib.load(f), tmp_path)
    assert config.data_dir.startswith(service["ReadWritePaths"] + "/")
    assert os.path.dirname(config.audit_log_path) == service["ReadWritePaths"]
    assert service["KillSignal"] == "SIGTERM"
    # Started = serving: fencingd sends READY=1 over $NOTIFY_SOCKET then (tests/test_sd_notify.py),
    # and a member waiting for its quorum is never timed out of its start.
    assert service["Type"] == "notify" and service.get("NotifyAccess", "main") == "main"
    assert service["TimeoutStartSec"] == "infinity"
    assert int(service["TimeoutStopSec"]) > config.shutdown_grace_s
    assert {2, EXIT_APPLY_FAILED, EXIT_DISK_FAILED} <= {int(c) for c in service["RestartPreventExitStatus"].split()}
    assert port(config.raft_address) == RAFT_PORT and port(config.api_address) == API_PORT
    assert config.initial_cluster_state == "new", "the example's members must bootstrap on first start"


# -- the probe command ------------------------------------------------------------------------


def run_health(address: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.server.fencingd", "health", "--address", address, "--timeout-s", "2"],
        capture_output=True, text=True, timeout=30,
    )


def test_fencingd_health_exits_zero_only_while_serving():
    servicer = health.HealthServicer()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    bound = server.add_insecure_port("127.0.0.1:0")
    server.start()
    address = f"127.0.0.1:{bound}"
    try:
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        refused = run_health(address)
        assert refused.returncode == 4 and "NOT_SERVING" in refused.stderr  # grpc_health_probe's code
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        ok = run_health(address)
        assert ok.returncode == 0 and "SERVING" in ok.stdout
    finally:
        server.stop(0)
    gone = run_health(address)  # nobody listens any more
    assert gone.returncode == 2 and "unreachable" in gone.stderr  # grpc_health_probe's code


@pytest.mark.parametrize("path", ["compose/node1.toml", "compose/node2.toml", "compose/node3.toml",
                                  "systemd/fencing.toml"])
def test_every_deployed_config_file_has_only_known_keys(path):
    config_mod.read_toml(os.path.join(DEPLOY, path))  # raises on an unknown key


# -- every deployed member refuses to run without the peer credential -------------------------


def deployed_member_values() -> dict[str, dict]:
    """Each deploy config file's keys, as the member it configures reads them."""
    out = {}
    for path in ("compose/node1.toml", "compose/node2.toml", "compose/node3.toml", "systemd/fencing.toml"):
        with open(os.path.join(DEPLOY, path), "rb") as f:
            out[path] = tomllib.load(f)
    with open(os.path.join(DEPLOY, "kubernetes", "fencing.yaml"), encoding="utf-8") as f:
        sts = next(d for d in yaml.safe_load_all(f) if d["kind"] == "StatefulSet")
    args = downward_args(sts["spec"]["template"]["spec"]["containers"][0], "fencing-0", "fencing")
    parsed = build_parser().parse_args(["serve", *args])
    out["kubernetes/fencing.yaml"] = {
        k: v for k, v in vars(parsed).items() if k in config_mod._FIELDS and v is not None
    }
    return out


def runnable_here(values: dict, tmp_path) -> dict:
    """``values`` with its paths in ``tmp_path`` and its addresses on this machine. The Raft
    address stays reachable from the network (0.0.0.0, every interface), as deployed."""
    from testsupport.supervisor import pick_ports

    raft_port, api_port = pick_ports(("127.0.0.1",))
    members = [f"0.0.0.0:{raft_port}=127.0.0.1:{api_port}", "0.0.0.0:1=127.0.0.1:2", "0.0.0.0:3=127.0.0.1:4"]
    local = {**values, "data_dir": str(tmp_path / "data"), "raft_address": f"0.0.0.0:{raft_port}",
             "members": members, "listen_address": f"127.0.0.1:{api_port}", "metrics_address": "",
             "cpu_affinity": "off", **secret_files(tmp_path)}
    if values.get("audit_log_path"):
        local["audit_log_path"] = str(tmp_path / "audit.log")
    return local


def write_config(path, values: dict) -> str:
    from testsupport.grpc_cluster import write_toml

    write_toml(str(path), values)
    return str(path)


@pytest.mark.parametrize("name", sorted(deployed_member_values()))
def test_a_member_from_each_deploy_config_refuses_to_start_without_the_credential(name, tmp_path):
    values = runnable_here(deployed_member_values()[name], tmp_path)
    without = {k: v for k, v in values.items() if k != "raft_secret_file"}
    refused = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config",
                              write_config(tmp_path / "without.toml", without)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1 and "configuration error: raft_secret_file: required" in refused.stderr
    proc = subprocess.Popen([sys.executable, "-m", "coordinator.server.fencingd", "serve", "--config",
                             write_config(tmp_path / "with.toml", values)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # ends at READY, or when the member exits
            lines.append(line)
            if line.startswith("READY "):
                break
        assert lines and lines[-1].startswith("READY "), "".join(lines)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _check_config(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "check-config", *argv],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", ["compose/node1.toml", "compose/node2.toml", "compose/node3.toml",
                                  "systemd/fencing.toml"])
def test_check_config_accepts_each_deploy_file(name, tmp_path):
    # The files name secrets on the target machine: values only here, then everything on a
    # copy whose paths exist on this one.
    proc = _check_config("--values-only", os.path.join(DEPLOY, name))
    assert proc.returncode == 0 and proc.stdout.endswith(": ok\n"), proc.stderr
    local = write_config(tmp_path / "local.toml", runnable_here(deployed_member_values()[name], tmp_path))
    proc = _check_config(local)
    assert proc.returncode == 0 and proc.stdout == f"{local}: ok\n", proc.stderr


def test_check_config_accepts_the_kubernetes_member_arguments():
    with open(os.path.join(DEPLOY, "kubernetes", "fencing.yaml"), encoding="utf-8") as f:
        sts = next(d for d in yaml.safe_load_all(f) if d["kind"] == "StatefulSet")
    args = downward_args(sts["spec"]["template"]["spec"]["containers"][0], "fencing-0", "fencing")
    proc = _check_config("--values-only", *args)
    assert proc.returncode == 0 and proc.stdout == "flags: ok\n", proc.stderr


def test_check_config_refuses_a_deploy_file_with_a_bad_value(tmp_path):
    with open(os.path.join(DEPLOY, "systemd", "fencing.toml"), encoding="utf-8") as f:
        text = f.read()
    bad = tmp_path / "bad.toml"
    bad.write_text(text + "\nheartbeat_s = 5.0\n", encoding="utf-8")
    proc = _check_config("--values-only", str(bad))
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr == "fencingd: configuration error: raft_min_timeout_s: must exceed 3 * heartbeat_s\n"


# -- hardening: systemd -----------------------------------------------------------------------

UNIT = os.path.join(DEPLOY, "systemd", "fencingd.service")
# The bar for `systemd-analyze security` (0 = locked down, 10 = fully exposed).
SYSTEMD_EXPOSURE_MAX = 2.0


def unit_service() -> dict[str, list[str]]:
    """[Service] key -> every value it is given (a key may repeat, e.g. SystemCallFilter)."""
    out: dict[str, list[str]] = {}
    section = None
    with open(UNIT, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and line and not line.startswith("#"):
                key, _, value = line.partition("=")
                out.setdefault(key, []).append(value)
    return out


def test_the_systemd_unit_keeps_no_privilege_and_writes_only_its_data():
    service = unit_service()
    want = {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "PrivateDevices": "yes", "PrivateUsers": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
        "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes", "ProtectClock": "yes", "ProtectHostname": "yes", "ProtectProc": "invisible",
        "RestrictNamespaces": "yes", "RestrictRealtime": "yes", "RestrictSUIDSGID": "yes", "LockPersonality": "yes",
        "SystemCallArchitectures": "native", "UMask": "0077", "User": "fencing", "Group": "fencing",
    }
    for key, value in want.items():
        assert service.get(key) == [value], f"fencingd.service: {key}={service.get(key)}, want {value!r}"
    assert service["ReadWritePaths"] == ["/var/lib/fencing"]
    assert service["SystemCallFilter"] == ["@system-service", "~@privileged"]
    # TCP for Raft and the API; nothing like AF_PACKET.
    assert set(service["RestrictAddressFamilies"][0].split()) <= {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}


def test_systemd_analyze_scores_the_unit_at_most_2():
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: apt-get install -y systemd (.ci/run installs it)"
    proc = subprocess.run([tool, "security", "--offline=yes", "--no-pager", os.path.basename(UNIT)],
                          capture_output=True, text=True, timeout=120, cwd=os.path.dirname(UNIT))
    m = re.search(r"Overall exposure level for fencingd\.service: (\d+\.\d+)", proc.stdout)
    assert m, f"no score from systemd-analyze (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    assert float(m.group(1)) <= SYSTEMD_EXPOSURE_MAX, proc.stdout


# -- hardening: Kubernetes Pod Security Standard "restricted" --------------------------------


def restricted_violations(pod_spec: dict) -> list[str]:
    """What the Pod Security Standard "restricted" profile (Kubernetes docs, "Pod Security
    Standards") refuses in ``pod_spec``; [] when a restricted namespace admits it."""
    bad = []
    pod_ctx = pod_spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(flag):
            bad.append(flag)
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            bad.append(f"volume {volume['name']}: {kinds - allowed_volumes}")
    containers = pod_spec.get("containers", []) + pod_spec.get("initContainers", [])
    for c in containers:
        ctx = c.get("securityContext", {})
        name = c["name"]
        if ctx.get("privileged"):
            bad.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds capabilities {caps['add']}")
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            bad.append(f"{name}: runAsNonRoot must be true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost, is {seccomp}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                bad.append(f"{name}: hostPort {port['hostPort']}")
    return bad


def kubernetes_docs() -> list[dict]:
    with open(os.path.join(DEPLOY, "kubernetes", "fencing.yaml"), encoding="utf-8") as f:
        return list(yaml.safe_load_all(f))


def test_the_restricted_check_refuses_what_the_old_manifest_had():
    # The pod spec as it was before it was hardened: a restricted namespace refuses it.
    old = {"securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
           "containers": [{"name": "fencingd", "image": "fencing-coordinator:latest"}]}
    assert restricted_violations(old) == [
        "fencingd: allowPrivilegeEscalation must be false", "fencingd: capabilities must drop ALL",
        "fencingd: seccompProfile must be RuntimeDefault or Localhost, is None"]


def test_the_kubernetes_pods_pass_pod_security_restricted_with_a_pinned_image():
    sts = next(d for d in kubernetes_docs() if d["kind"] == "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts, "a read-only root needs a writable /tmp"
    # The image's user, so the data volume (fsGroup) is its own.
    assert pod["securityContext"]["runAsUser"] == 10001 == int(
        re.search(r"--uid (\d+)", " ".join(dockerfile()["RUN"])).group(1))
    name, _, tag = container["image"].rpartition(":")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert tag == version, f"{container['image']}: pin the image to the package version {version}"
    assert container["imagePullPolicy"] in ("IfNotPresent", "Always")


# -- the systemd install steps, followed in a scratch root ------------------------------------

# Install lines the test cannot follow here, with the reason; any other line runs.
INSTALL_NOT_RUN = {
    "apt-get install -y python3-venv openssl": "installs host packages (this machine has both)",
    "/opt/fencing/venv/bin/pip install '/path/to/fencing-coordinator[server]'":
        "downloads the server's dependencies; this checkout's fencingd goes into the venv instead",
    "systemctl daemon-reload && systemctl enable --now --no-block fencingd": "no systemd runs here",
}


def install_steps() -> list[str]:
    """The commands of fencingd.service's header, in order."""
    with open(UNIT, encoding="utf-8") as f:
        header = f.read().split("[Unit]")[0]
    return [line[len("#   "):].strip() for line in header.splitlines() if line.startswith("#   ")]


def in_root(command: str, root: str, ids: dict[str, tuple[str, str]]) -> str:
    """``command`` with /etc, /var/lib and /opt under ``root``, users by the id ``root``'s
    passwd gives them (the host has no such user), useradd writing ``root``'s passwd."""
    command = re.sub(r"^useradd ", f"useradd --prefix {root} ", command)
    if not command.startswith("useradd "):
        command = re.sub(r"(?<![\w./-])/(etc|var/lib|opt)/", rf"{root}/\1/", command)
    for name, (uid, gid) in ids.items():
        command = re.sub(rf"-o {name}\b", f"-o {uid}", command)
        command = re.sub(rf"-g {name}\b", f"-g {gid}", command)
        command = command.replace(f"chown {name}:{name} ", f"chown {uid}:{gid} ")
    return command


def test_the_systemd_install_steps_work_on_a_fresh_host(tmp_path):
    assert os.geteuid() == 0, "the install steps run as root (useradd, chown): run this test as root, as CI does"
    root = str(tmp_path / "root")
    os.makedirs(f"{root}/etc/systemd/system")  # what any host running systemd already has
    for name in ("passwd", "group", "shadow", "gshadow"):  # a host's accounts, before useradd
        shutil.copy(f"/etc/{name}", f"{root}/etc/{name}")
    steps = install_steps()
    assert set(INSTALL_NOT_RUN) <= set(steps), "INSTALL_NOT_RUN lists a line the unit no longer has"
    ids: dict[str, tuple[str, str]] = {}
    for step in steps:
        if step in INSTALL_NOT_RUN:
            if "pip install" in step:  # the venv gets this checkout's fencingd instead
                wrapper = f"{root}/opt/fencing/venv/bin/fencingd"
                with open(wrapper, "w", encoding="utf-8") as f:
                    f.write(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m coordinator.server.fencingd "$@"\n')
                os.chmod(wrapper, 0o755)
            continue
        command = in_root(step, root, ids)
        if "check-config" in step:
            # The example's addresses are another machine's (10.0.0.1): values only here; the
            # secret files the steps made are checked below.
            command = command.replace("check-config", "check-config --values-only")
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, cwd=REPO)
        assert proc.returncode == 0, f"{step}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
        if step.startswith("useradd "):
            with open(f"{root}/etc/passwd", encoding="utf-8") as f:
                entry = next(line.split(":") for line in f if line.startswith("fencing:"))
            with open(f"{root}/etc/group", encoding="utf-8") as f:
                group = next(line.split(":") for line in f if line.startswith("fencing:"))
            assert entry[3] == group[2], "useradd --user-group: the user's own group is its primary group"
            ids["fencing"] = (entry[2], group[2])
    uid, gid = (int(n) for n in ids["fencing"])

    def owner_mode(path: str) -> tuple[int, int, str]:
        st = os.stat(root + path)
        return st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)

    service = unit_service()
    # The service's user reaches its config, owns its data and its secrets; nobody else reads them.
    assert owner_mode("/etc/fencing") == (0, gid, "0o750")
    assert owner_mode("/etc/fencing/fencing.toml") == (0, gid, "0o640")
    assert owner_mode("/etc/fencing/raft-secret") == (uid, gid, "0o600")
    assert owner_mode("/etc/fencing/admin-token") == (uid, gid, "0o600")
    assert owner_mode(service["ReadWritePaths"][0]) == (uid, gid, "0o700")
    assert os.path.exists(root + "/etc/systemd/system/fencingd.service")
    assert os.access(root + shlex.split(service["ExecStart"][0])[0], os.X_OK)
    # The installed config, with the secrets the steps made, is one fencingd accepts.
    with open(root + CONFIG_PATH, "rb") as f:
        values = tomllib.load(f)
    files = {key: root + values[key] for key in ("admin_token_file", "raft_secret_file")}
    config_mod.build(values, files)  # reads both secrets: present, readable, long enough
