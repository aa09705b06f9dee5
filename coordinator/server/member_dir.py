"""Whether ``data_dir`` is this member's, asked before it starts (``serve``, ``check-config``).

Owns: comparing the identity a data dir holds (``member.identity``, coordinator/raft/identity.py)
with the member id the configuration gives this member (``member_id``, or its place among the
initial ``members``, as the Raft node derives it), and saying why not in one line that names
the settings.
Must never: create or write anything in the data dir (an empty or missing one is fine: the
member makes its identity when it starts), or decide what a member may do with its identity
(the Raft layer does).
"""

from __future__ import annotations

from coordinator.raft import identity
from coordinator.raft.membership import initial_member_id
from coordinator.server.settings import ServerConfig


def configured_member_id(config: ServerConfig) -> str:
    """The id this member runs as: ``member_id``, else its place among the initial members."""
    return config.member_id or initial_member_id(config.raft_address, config.member_map)


def why_not_mine(config: ServerConfig) -> str | None:
    """None if ``config.data_dir`` is empty, missing or this member's; else the line that says why
    the member must not start on it."""
    try:
        found = identity.read(config.data_dir)
    except identity.IdentityError as exc:  # damaged: it says which file and why
        return f"data_dir: {exc}"
    except OSError as exc:
        return f"data_dir: cannot read {config.data_dir}: {exc.strerror or exc}"
    if found is None:
        return None
    wanted = configured_member_id(config)
    if found.member_id == wanted:
        return None
    return (f"data_dir {config.data_dir} belongs to member {found.member_id} (its {identity.IDENTITY_NAME}),"
            f" but this member is {wanted} (member_id, or its place in members): give each member its own"
            " data dir")
