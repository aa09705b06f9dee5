"""Several peer secrets at once, and ``raft_secret_file`` read as a list of them.

``PeerKeys`` (coordinator/raft/peer_keys.py) sends under the first secret and accepts any; with
one secret its frames are the ones pysyncobj's own Fernet makes and accepts (members of an
earlier version, and a file of one line, see no change). The file's parse refuses, naming the
setting, anything a rotation should never produce. The rotation itself, on running members,
is tests/test_secret_rotation.py.
"""

from __future__ import annotations

import pytest
from cryptography.fernet import InvalidToken
from pysyncobj.encryptor import getEncryptor

from coordinator.raft import limits as raft_limits
from coordinator.raft.peer_keys import PeerKeys
from coordinator.server.config import ConfigError, ServerConfig

OLD = "old-peer-secret-0123456789abcdef0123456789"
NEW = "new-peer-secret-0123456789abcdef0123456789"
NOW = 1_000  # pysyncobj stamps frames with its monotonic clock: any integer time will do
FRAME = b"\x92\x01\xc4\x03abc"


def test_one_secret_sends_and_accepts_exactly_what_pysyncobjs_fernet_does():
    keys, stock = PeerKeys([OLD]), getEncryptor(OLD)
    ours = keys.encrypt_at_time(FRAME, NOW)
    assert stock.decrypt(ours) == FRAME and stock.extract_timestamp(ours) == NOW
    theirs = stock.encrypt_at_time(FRAME, NOW)
    assert keys.decrypt(theirs) == FRAME and keys.extract_timestamp(theirs) == NOW
    assert len(ours) == len(theirs)  # the frame bounds (limits.fernet_token_bytes) hold as they were


def test_the_first_secret_sends_and_every_one_is_accepted():
    keys = PeerKeys([NEW, OLD])
    sent = keys.encrypt_at_time(FRAME, NOW)
    assert getEncryptor(NEW).decrypt(sent) == FRAME
    with pytest.raises(InvalidToken):
        getEncryptor(OLD).decrypt(sent)
    for secret in (NEW, OLD):
        token = getEncryptor(secret).encrypt_at_time(FRAME, NOW)
        assert keys.extract_timestamp(token) == NOW and keys.decrypt(token) == FRAME
    stranger = getEncryptor("a-stranger-secret-0123456789abcdef012").encrypt_at_time(FRAME, NOW)
    with pytest.raises(InvalidToken):
        keys.extract_timestamp(stranger)
    with pytest.raises(InvalidToken):
        keys.decrypt(stranger)


def test_replace_takes_effect_on_the_same_object_and_drops_the_old_secret():
    """Connections hold the object, not a copy: what replace changes, they all see."""
    keys = PeerKeys([OLD])
    old_frame = getEncryptor(OLD).encrypt_at_time(FRAME, NOW)
    keys.replace([NEW])
    assert getEncryptor(NEW).decrypt(keys.encrypt_at_time(FRAME, NOW)) == FRAME
    with pytest.raises(InvalidToken):
        keys.decrypt(old_frame)


@pytest.mark.parametrize("count", [0, raft_limits.RAFT_SECRETS_MAX + 1])
def test_a_refused_set_changes_nothing(count):
    keys = PeerKeys([OLD])
    with pytest.raises(ValueError, match="RAFT_SECRETS_MAX"):
        keys.replace([f"{i:02d}-secret-0123456789abcdef0123456789" for i in range(count)])
    assert getEncryptor(OLD).decrypt(keys.encrypt_at_time(FRAME, NOW)) == FRAME
    assert keys.count == 1


# -- raft_secret_file ------------------------------------------------------------------------


def secrets_in(tmp_path, text: str) -> tuple[str, ...]:
    path = tmp_path / "raft-secret"
    path.write_bytes(text.encode())
    return ServerConfig(raft_secret_file=str(path)).resolved_raft_secrets()


def test_a_file_of_one_line_is_the_one_secret_it_always_was(tmp_path):
    # What fencingd gen-secret writes, and what the file held before it could hold several.
    assert secrets_in(tmp_path, OLD + "\n") == (OLD,)
    assert secrets_in(tmp_path, "  " + OLD + "\r\n\n") == (OLD,)


def test_several_lines_are_several_secrets_in_order(tmp_path):
    assert secrets_in(tmp_path, f"{NEW}\n\n  {OLD}  \r\n") == (NEW, OLD)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is empty"),
        ("\n \n", "is empty"),
        (f"{NEW}\nshort\n", "secret 2 holds 5 characters; use at least 32"),
        (f"{NEW}\n{OLD}\n{NEW}\n", "secret 3 repeats an earlier line"),
        (
            "".join(f"{i:02d}-secret-0123456789abcdef0123456789\n" for i in range(raft_limits.RAFT_SECRETS_MAX + 1)),
            f"holds {raft_limits.RAFT_SECRETS_MAX + 1} secrets;"
            f" at most {raft_limits.RAFT_SECRETS_MAX} (RAFT_SECRETS_MAX)",
        ),
    ],
    ids=["empty", "blank", "short", "duplicate", "too-many"],
)
def test_a_bad_file_is_refused_naming_the_setting(tmp_path, text, message):
    with pytest.raises(ConfigError) as refused:
        secrets_in(tmp_path, text)
    assert str(refused.value).startswith("raft_secret_file: ") and message in str(refused.value)


def test_as_many_as_the_bound_are_taken(tmp_path):
    lines = [f"{i:02d}-secret-0123456789abcdef0123456789" for i in range(raft_limits.RAFT_SECRETS_MAX)]
    assert secrets_in(tmp_path, "\n".join(lines)) == tuple(lines)
