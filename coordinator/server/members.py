"""The cluster's members as the API shows them, and the Admin membership changes.

Owns: turning the Raft node's membership status into ``pb.Member`` messages (Status and the
Member* Admin RPCs), checking a change's member id and Raft address before anything is
proposed, and running one change (``RaftNode.add_member`` / ``remove_member`` /
``replace_member``) into a response or a ServiceError (errors.from_member_change).
Must never: touch the Raft library (the Raft node does), decide whether a change is allowed (the
leader does, against its log), or authorize and audit (admin.py's ``_admin`` does).
"""

from __future__ import annotations

from typing import Callable

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.raft import limits as raft_limits
from coordinator.raft.interface import MemberChangeResult, ProposeOutcome
from coordinator.server import errors, log_limits


def member_messages(status: dict, api_addresses: dict[str, str]) -> list[pb.Member]:
    """Every member of the configuration in ``status`` (RaftNode.status or members()), with the
    API address the config file gives for its Raft address ("" for a member added later)."""
    return [
        pb.Member(
            id=m["address"],
            api_address=api_addresses.get(m["address"], ""),
            is_leader=m["role"] == "leader",
            member_id=m["member_id"],
            incarnation=m["incarnation"],
            role=m["role"],
            match_index=m["match_index"],
            voter=m["voter"],
        )
        for m in status.get("members", ())
    ]


def checked_member_id(value: str) -> str:
    if not 0 < len(value) <= raft_limits.RAFT_MEMBER_ID_CHARS_MAX or not value.isprintable() or " " in value:
        raise errors.invalid("member_id", "member_id: 1 to RAFT_MEMBER_ID_CHARS_MAX printable characters, no spaces")
    return value


def checked_raft_address(value: str) -> str:
    host, _, port = value.rpartition(":")
    ok = bool(host) and port.isdigit() and 0 < int(port) < 65536 and len(value) <= raft_limits.RAFT_ADDRESS_CHARS_MAX
    if not ok or " " in value:
        # A prefix of the value, never all of it: it is the caller's (up to a gRPC message).
        raise errors.invalid("raft_address", f"raft_address: {log_limits.shown(value)} is not HOST:PORT")
    return value


def run_change(
    change: Callable[[], MemberChangeResult], node, api_addresses: dict[str, str], leader_hint
) -> tuple[pb.MemberListResponse, int]:
    """Run ``change`` (a bound RaftNode call); the configuration after it, or ServiceError."""
    result = change()
    if result.outcome is not ProposeOutcome.APPLIED:
        raise errors.from_member_change(result, *leader_hint())
    return listing(node, api_addresses, result.index), result.index


def listing(node, api_addresses: dict[str, str], index: int = 0) -> pb.MemberListResponse:
    status = node.members()
    return pb.MemberListResponse(
        cluster_id=status["cluster_id"] or "", members=member_messages(status, api_addresses), index=index
    )
