"""Operations material: the domain metrics (leases, lock waiters, refusals by reason, lease
expiries), and the alert rules and Grafana dashboard under deploy/ checked against what a live
three-process cluster exports.

Every series an alert expression or a dashboard query names must be one a member exports
(histograms by their ``_bucket``/``_sum``/``_count`` series), and every exact label value they
match on (``reason="STALE_TOKEN"``, ``outcome=~"not_applied|unknown"``) must be one a member
exports too: a renamed metric or reason breaks this test, not a dashboard nobody looks at.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request

import grpc
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core import commands as c
from coordinator.core.names import ErrorReason
from coordinator.core.state_machine import FencingStateMachine
from coordinator.server.metrics import Metrics
from testsupport.grpc_cluster import RPC_TIMEOUT_S, metered_cluster
from testsupport.supervisor import wait_until

T = RPC_TIMEOUT_S
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALERTS = os.path.join(REPO, "deploy", "prometheus", "alerts.yml")
ALERT_TESTS = os.path.join(REPO, "deploy", "prometheus", "alerts_test.yml")
SCRAPE_CONFIG = os.path.join(REPO, "deploy", "prometheus", "prometheus.yml")
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "fencing-dashboard.json")

# Series Prometheus makes itself for every target; no member exports them.
PROMETHEUS_SERIES = {"up"}
# Labels Prometheus attaches to every scraped series (the scrape job and target).
TARGET_LABELS = {"job", "instance"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                "bool", "offset", "inf", "nan"}


# -- reading PromQL, simply ----------------------------------------------------------------


def series_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: identifiers that are not functions, keywords,
    label names (inside ``{}``, ``by (...)``, ``on (...)``...), strings, ranges or variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values, regexes)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\$\w+", "", text)  # Grafana variables ($__rate_interval, $job)
    found = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()", text):
        if match.group(0).lower() not in PROMQL_WORDS:
            found.add(match.group(0))
    return found


def label_matches(expr: str) -> set[tuple[str, str]]:
    """(label, value) of every ``=`` and ``=~`` matcher in ``expr``; a regex counts as the
    words it alternates (``a|b``), and one with other syntax is skipped."""
    found = set()
    for body in re.findall(r"\{([^}]*)\}", expr):
        for label, op, value in re.findall(r'(\w+)\s*(=~|=)\s*"([^"]*)"', body):
            words = value.split("|") if op == "=~" else [value]
            if all(re.fullmatch(r"\w+", w) for w in words):
                found.update((label, w) for w in words)
    return found


def alert_expressions() -> dict[str, str]:
    with open(ALERTS, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_expressions() -> dict[str, str]:
    with open(DASHBOARD, encoding="utf-8") as f:
        dashboard = json.load(f)
    found = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            metric = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
            assert metric, f"variable {variable['name']}: {query}"
            found[f"variable {variable['name']!r}"] = metric.group(1)
    return found


def test_the_promql_reader_finds_series_and_only_series():
    expr = ('histogram_quantile(0.99, sum by (instance, le) (rate(a_seconds_bucket{job=~"$job"}[5m]))) > 1e6 '
            'and on (instance) increase(b_total{reason="STALE_TOKEN"}[$__rate_interval]) == 0 or up')
    assert series_names(expr) == {"a_seconds_bucket", "b_total", "up"}
    assert label_matches('x{reason=~"A|B", outcome="c", job=~".*"}') == {("reason", "A"), ("reason", "B"),
                                                                         ("outcome", "c")}


def test_every_alert_has_a_severity_a_summary_and_a_description():
    with open(ALERTS, encoding="utf-8") as f:
        rules = [rule for group in yaml.safe_load(f)["groups"] for rule in group["rules"]]
    assert len(rules) >= 10
    for rule in rules:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    expressions = " ".join(alert_expressions().values())
    for wanted in ("fencing_raft_is_leader", "fencing_raft_has_quorum", "fencing_raft_leader_changes_seen_total",
                   "fencing_journal_fsync_duration_seconds_bucket", "fencing_proposals_total",
                   "fencing_refusals_total", "fencing_lease_expiries_total", "fencing_raft_pre_votes_started_total",
                   "fencing_raft_pre_votes_won_total"):
        assert wanted in expressions, f"no alert reads {wanted}"


def test_promtool_checks_the_rules_their_unit_tests_and_the_scrape_config():
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    for args in (["check", "rules", ALERTS], ["test", "rules", ALERT_TESTS], ["check", "config", SCRAPE_CONFIG]):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert "SUCCESS" in done.stdout + done.stderr


# -- the state's totals, exact under any history ------------------------------------------------

ACTIONS = ["acquire", "enqueue", "enqueue", "cancel", "release", "expire", "force", "fence_all", "restore"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 2), st.integers(0, 3)), max_size=40))
def test_lease_and_waiter_totals_equal_a_scan_of_the_state(steps):
    """The totals the gauges read (kept as leases change, never by scanning) equal a scan."""
    sm = FencingStateMachine()
    now = 0
    for n, (action, r, w) in enumerate(steps):
        now += 200
        op_id = n.to_bytes(16, "big")  # unique per step: no dedup between them
        name, waiter_id = f"r{r}", bytes([w + 1]) * 16
        lease = (sm.describe(name) or {}).get("lease")
        if action == "acquire":
            sm.execute(c.acquire(resource=name, holder="h", ttl_ms=1_000, op_id=op_id, stamp_ms=now))
        elif action == "enqueue":
            sm.execute(c.enqueue(resource=name, holder=f"w{w}", ttl_ms=1_000, waiter_id=waiter_id, stamp_ms=now))
        elif action == "cancel":
            sm.execute(c.dequeue(resource=name, waiter_id=waiter_id, stamp_ms=now))
        elif action == "release" and lease is not None:
            sm.execute(c.release(resource=name, token=lease["token"], stamp_ms=now))
        elif action == "expire":
            now += 1_000
            sm.execute(c.tick(stamp_ms=now))
        elif action == "force":
            sm.execute(c.force_release(resource=name, op_id=op_id, stamp_ms=now))
        elif action == "fence_all":
            sm.execute(c.set_epoch_floor(floor=sm.epoch + 1, stamp_ms=now))
        elif action == "restore":
            copy = FencingStateMachine()
            copy.restore(sm.snapshot())
            sm = copy
        resources = sm._resources.values()
        assert sm.leases_count == sum(res.lease is not None for res in resources), steps
        assert sm.lock_waiters_count == sum(len(res.waiters) for res in resources), steps


def test_every_reason_is_exported_from_the_start_and_counted_by_its_own_label():
    metrics = Metrics()
    metrics.count_refusal(ErrorReason.STALE_TOKEN)
    metrics.count_refusal(ErrorReason.STALE_TOKEN)
    found = {s.labels["reason"]: s.value
             for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
             for s in family.samples if s.name == "fencing_refusals_total"}
    assert set(found) == set(ErrorReason)
    assert found.pop(ErrorReason.STALE_TOKEN) == 2
    assert set(found.values()) == {0}


# -- a live cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    yield from metered_cluster(str(tmp_path_factory.mktemp("monitoring")), request)


def scrape(url: str) -> list:
    with urllib.request.urlopen(url, timeout=T) as reply:
        return [s for family in text_string_to_metric_families(reply.read().decode()) for s in family.samples]


def value(samples: list, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_domain_metrics_on_a_live_cluster(cluster):
    leader = cluster.wait_ready()
    node, url = cluster.nodes[leader], cluster.metrics_urls[leader]
    before = scrape(url)
    base = f"monitoring/{os.urandom(4).hex()}"

    def acquire(resource: str, ttl_ms: int = 60_000) -> pb.AcquireResponse:
        return node.lease.Acquire(pb.AcquireRequest(resource=base + resource, holder="a", ttl_ms=ttl_ms,
                                                    op_id=os.urandom(16)), timeout=T)

    old = acquire("/stale").token
    node.lease.Release(pb.ReleaseRequest(resource=base + "/stale", token=old), timeout=T)
    acquire("/stale")  # the first token is stale now
    held = node.lease.Acquire(pb.AcquireRequest(resource=base + "/held", holder="a", ttl_ms=60_000,
                                                op_id=os.urandom(16)), timeout=T)
    refused(lambda: node.lease.Acquire(pb.AcquireRequest(resource=base + "/held", holder="b", ttl_ms=60_000,
                                                         op_id=os.urandom(16)), timeout=T))
    refused(lambda: node.store.Write(pb.WriteRequest(resource=base + "/stale", key="k", value=b"v",
                                                     token=old, op_id=os.urandom(16)), timeout=T))
    refused(lambda: node.store.Write(pb.WriteRequest(resource=base + "/held", key="k", value=b"v", token=held.token,
                                                     op_id=os.urandom(16), expected_version=7), timeout=T))
    many = node.store.WriteMany(pb.WriteManyRequest(writes=[pb.WriteRequest(
        resource=base + "/held", key="k", value=b"v", token=held.token + 5, op_id=os.urandom(16))]), timeout=T)
    assert many.results[0].error.reason == ErrorReason.UNKNOWN_TOKEN
    queued = node.lease.Lock(pb.LockRequest(resource=base + "/held", holder="c", ttl_ms=60_000,
                                            waiter_id=os.urandom(16), wait_ms=0), timeout=T)
    assert queued.queued and not queued.granted
    acquire("/short", ttl_ms=100)
    after = scrape(url)
    for reason in (ErrorReason.LEASE_HELD, ErrorReason.STALE_TOKEN, ErrorReason.VERSION_MISMATCH,
                   ErrorReason.UNKNOWN_TOKEN):
        grew = value(after, "fencing_refusals_total", reason=reason) - value(before, "fencing_refusals_total",
                                                                              reason=reason)
        assert grew == 1, (reason, grew)
    # Bounded labels: no resource name (nor anything else a caller chose) becomes a label.
    assert not [s for s in after if any(base in v for v in s.labels.values())]
    assert value(after, "fencing_lock_waiters") - value(before, "fencing_lock_waiters") == 1
    assert value(after, "fencing_leases") - value(before, "fencing_leases") >= 1
    assert value(after, "fencing_resources") >= 3
    # The short lease ends by expiry in a TICK of the leader (each member counts the TICKs it
    # proposed; the sum is the cluster's).
    expired_before = sum(value(scrape(u), "fencing_lease_expiries_total") for u in cluster.metrics_urls)
    wait_until(lambda: sum(value(scrape(u), "fencing_lease_expiries_total") for u in cluster.metrics_urls)
               > expired_before, timeout_s=15, what="the short lease's expiry to be counted")
    # Followers apply the same log: the same totals once they caught up.
    leases = value(scrape(url), "fencing_leases")
    for i, other in enumerate(cluster.metrics_urls):
        wait_until(lambda other=other: value(scrape(other), "fencing_leases") == leases and
                   value(scrape(other), "fencing_lock_waiters") == value(scrape(url), "fencing_lock_waiters"),
                   timeout_s=10, what=f"member {i} to report the leader's totals")


def test_every_series_the_alerts_and_the_dashboard_name_is_exported(cluster):
    cluster.wait_ready()
    samples = [s for url in cluster.metrics_urls for s in scrape(url)]
    exported = {s.name for s in samples}
    exported_labels = {(k, v) for s in samples for k, v in s.labels.items()}
    expressions = {**{f"alert {k}": v for k, v in alert_expressions().items()}, **dashboard_expressions()}
    assert len(expressions) >= 30
    missing, unknown_values = [], []
    for where, expr in expressions.items():
        missing += [(where, name) for name in series_names(expr) - exported - PROMETHEUS_SERIES]
        unknown_values += [(where, m) for m in label_matches(expr) - exported_labels if m[0] not in TARGET_LABELS]
    assert not missing, f"series no member exports: {missing}"
    assert not unknown_values, f"label values no member exports: {unknown_values}"
