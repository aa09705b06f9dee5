"""The peer secrets a member holds, and their replacement without a restart.

Owns: ``PeerKeys``, what pysyncobj's connections call ``encryptor`` (``encrypt_at_time``,
``extract_timestamp``, ``decrypt``): frames are sent under the first secret and accepted under
any of them (cryptography's MultiFernet), and ``replace`` swaps the whole set at once, so a
SIGHUP that re-reads ``raft_secret_file`` takes effect at every connection's next frame.
SECURITY.md "What SIGHUP reloads" has the rotation procedure this makes possible.
Must never: derive a key any other way than pysyncobj does (``getEncryptor``: one secret gives
the bytes a member of any earlier version sends and accepts), hold more than
``raft_limits.RAFT_SECRETS_MAX`` secrets, or leave a half-replaced set visible to the Raft
thread.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.fernet import MultiFernet
from pysyncobj.encryptor import getEncryptor

from coordinator.raft import limits as raft_limits


class PeerKeys:
    """The member's peer secrets: the first one sends, all of them receive.

    pysyncobj gives every connection the object ``SyncObj.encryptor`` returns when it creates
    the connection (transport.py:325-327, 529) and keeps it: all connections share this one,
    so ``replace`` reaches established connections too, not only new ones.
    """

    def __init__(self, secrets: Sequence[str]) -> None:
        self._fernet: MultiFernet
        self.count = 0  # secrets held, for the log
        self.replace(secrets)

    def replace(self, secrets: Sequence[str]) -> None:
        """Send under ``secrets[0]`` and accept any of ``secrets`` from the next frame on.

        ValueError (and nothing changes) for no secret or more than RAFT_SECRETS_MAX (the
        server's config check says which line is wrong before it gets here). The keys are
        derived (PBKDF2, ~50 ms each) before the swap; the swap is one attribute store, so the
        Raft thread sees the old set or the new one, never a mix.
        """
        secrets = tuple(secrets)
        if not 1 <= len(secrets) <= raft_limits.RAFT_SECRETS_MAX:
            raise ValueError(f"{len(secrets)} peer secrets; 1 to {raft_limits.RAFT_SECRETS_MAX} (RAFT_SECRETS_MAX)")
        fernet = MultiFernet([getEncryptor(secret) for secret in secrets])
        self._fernet = fernet
        self.count = len(secrets)

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        return self._fernet.encrypt_at_time(data, current_time)

    def extract_timestamp(self, token: bytes) -> int:
        return self._fernet.extract_timestamp(token)

    def decrypt(self, token: bytes) -> bytes:
        return self._fernet.decrypt(token)

