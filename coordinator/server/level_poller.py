"""Rolling upgrades: each member announces its entry level; the leader raises the cluster's.

Owns: how a member announces the entry levels it applies (one grpc.health.v1 service name per
level above 1, ``level_service``, SERVING from start: the health service needs no credential,
and a member of the release before levels answers NOT_FOUND for it, which counts as level 1),
and ``LevelPoller``, a thread that, while this member leads and the cluster's level is below
its own, asks every member of the replicated configuration (voters and learners: a learner
applies every entry too) which levels it announces and, once every one of them announces a
higher level, proposes SET_CLUSTER_LEVEL (DESIGN §8 "Rolling upgrades").
Must never: raise the level while any member's level is unknown (unreachable, no API address,
NOT_SERVING while it shuts down: it may run an older build), lower it, propose on a member that
does not lead, or let an error end its thread (a failed round is tried again next interval).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.core import commands, ops
from coordinator.core.results import LevelResult, expect
from coordinator.raft.node import RaftNode
from coordinator.server.errors import ServiceError
from coordinator.server.proposer import Proposer

log = logging.getLogger(__name__)

# How often the leader asks the members for their levels while the cluster's is below its own
# (then it stops asking), and how long one member's answer may take. A member's levels change
# only when it restarts on another build, so a second between rounds costs an upgrade a second.
LEVEL_POLL_INTERVAL_S = 1.0
LEVEL_POLL_TIMEOUT_S = 1.0


def level_service(level: int) -> str:
    """The health service name a member that applies entry level ``level`` serves."""
    return f"fencing.entry_level.{level}"


def announced_services() -> list[str]:
    """The health service names this build announces: one per level above the first."""
    return [level_service(level) for level in range(2, commands.ENTRY_LEVEL + 1)]


def member_level(api_address: str, floor: int, credentials: Any = None,
                 timeout_s: float = LEVEL_POLL_TIMEOUT_S) -> int | None:
    """The highest level above ``floor`` (the cluster's) that the member at ``api_address``
    announces, ``floor`` when it announces none (NOT_FOUND: an older build), or None when its
    answer says nothing (unreachable, or NOT_SERVING while it starts or stops)."""
    target = grpc.insecure_channel(api_address) if credentials is None else grpc.secure_channel(
        api_address, credentials)
    with target as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # the generated stub declares no methods
        for level in range(commands.ENTRY_LEVEL, floor, -1):
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=level_service(level)), timeout=timeout_s)
            except grpc.RpcError as error:
                if error.code() is grpc.StatusCode.NOT_FOUND:
                    continue  # does not apply that level; maybe a lower one
                return None
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return None
            return level
    return floor


class LevelPoller(threading.Thread):
    """The leader's job of raising the cluster level once every member runs a later build."""

    def __init__(self, node: RaftNode, proposer: Proposer, api_addresses: dict[str, str], *,
                 credentials: Any = None, timeout_s: float, interval_s: float = LEVEL_POLL_INTERVAL_S) -> None:
        super().__init__(name="level-poller", daemon=True)
        self.node = node
        self.proposer = proposer
        self.api_addresses = api_addresses  # Raft address -> API address (the config file's)
        self.credentials = credentials  # the API's channel credentials (None: plaintext)
        self.timeout_s = timeout_s  # the SET_CLUSTER_LEVEL's wait for its fate
        self.interval_s = interval_s
        self._stopping = threading.Event()  # not _stop: Thread.join calls its own _stop()
        self._last_wait = ""  # what the last round waited for, logged once per change

    def poll_once(self) -> int | None:
        """One round: the level it raised the cluster to, or None (not the leader, the level is
        this build's already, a member's level is lower or unknown, or the proposal failed)."""
        if not self.node.is_leader():
            return None
        cluster_level = self.node.read(lambda sm: sm.cluster_level)
        if cluster_level >= commands.ENTRY_LEVEL:
            return None
        status = self.node.status()
        members = status.get("members") or []
        if status["self"] not in {member["address"] for member in members}:
            self._waiting("no replicated configuration naming this member yet")
            return None  # which members there are is unknown: none may be skipped
        lowest = commands.ENTRY_LEVEL
        for member in members:
            address = member["address"]
            if address == status["self"]:
                continue  # this build
            api = self.api_addresses.get(address, "")
            level = member_level(api, cluster_level, self.credentials) if api else None
            if level is None or level <= cluster_level:
                self._waiting(f"member {address} ({api or 'no API address known'}) announces"
                              f" {'nothing' if level is None else f'entry level {level}'}")
                return None
            lowest = min(lowest, level)
        try:
            result = self.proposer.propose(ops.SetClusterLevel(level=lowest), self.timeout_s,
                                           client_slot=False)
        except ServiceError as error:  # lost leadership, deadline: the next round tries again
            log.info("level poller: SET_CLUSTER_LEVEL not applied: %s", error.reason)
            return None
        raised = expect(LevelResult, result.value.result).level
        log.info("cluster entry level raised from %d to %d: every member announces it", cluster_level, raised)
        return raised

    def _waiting(self, why: str) -> None:
        if why != self._last_wait:
            self._last_wait = why
            log.info("level poller: the cluster entry level stays: %s", why)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.poll_once()
            except Exception:  # any failure, whatever its type: logged, and the next round tries again
                log.exception("level poller: round failed")
            self._stopping.wait(self.interval_s)

    def stop(self) -> None:
        self._stopping.set()
