"""One chaos cluster at a time per network namespace: the packet filters are shared.

Every chaos run names its packet filters the same way (the nft table ``harness.NFT_TABLE``, the
iptables NFQUEUE rules tagged ``chaos-delay``) and deletes them whole when it heals or ends. Two
runs in one network namespace therefore heal each other's partitions mid-fault and find their
own rules gone ("nft add rule inet chaos ...: No such file or directory"): both runs' figures and
verdicts mean nothing, and nothing said so. So the first ``claim()`` in a process takes an
exclusive ``flock`` on a file named after the network namespace, and the last ``release()``
gives it back; another process's ``claim()`` meanwhile raises ``PacketFiltersBusy`` naming the
holder's pid. Runs in namespaces of their own (``unshare -n``) never meet.

The lock is the kernel's: a holder that dies, even by SIGKILL, releases it with its descriptor.
"""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import threading

NETNS_PATH = "/proc/self/ns/net"


class PacketFiltersBusy(RuntimeError):
    """Another process holds this network namespace's chaos packet filters."""


_lock = threading.Lock()
_fd: int | None = None
_depth = 0


def claim_path() -> str:
    """The lock file of this process's network namespace (its inode names the namespace)."""
    try:
        netns = str(os.stat(NETNS_PATH).st_ino)
    except OSError:  # no /proc: one namespace as far as we can tell
        netns = "default"
    return os.path.join(tempfile.gettempdir(), f"fencing-chaos-netns-{netns}.lock")


def claim() -> None:
    """Hold this namespace's chaos packet filters (again, if this process already does)."""
    global _fd, _depth
    with _lock:
        if _fd is None:
            _fd = _take(claim_path())
        _depth += 1


def release() -> None:
    """Undo one ``claim()``; the last one gives the lock back. Never raises."""
    global _fd, _depth
    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0 and _fd is not None:
            os.close(_fd)  # closing the descriptor drops the flock
            _fd = None


def held() -> bool:
    """Whether this process holds the claim."""
    with _lock:
        return _depth > 0


def _take(path: str) -> int:
    # The file sits in a shared temporary directory and a run is root: never follow a link put
    # there, and never truncate anything but a plain file of our own (not inherited: PEP 446).
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PacketFiltersBusy(f"{path} is not a plain file of this user: remove it, then run again")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise PacketFiltersBusy(
            f"another chaos run (pid {holder or 'unknown'}) is using this network namespace's packet "
            "filters; run one at a time, or each in a network namespace of its own "
            "(unshare -n sh -c 'ip link set lo up && python -m chaos run ...')"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd
