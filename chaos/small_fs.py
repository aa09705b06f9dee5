"""A member's data dir on a small filesystem of its own, which the ``disk_full`` fault fills.

Owns: one loop-mounted ext4 image per member (``SmallFs``: create + mount, fill until ENOSPC,
unfill, lazy unmount), and the proof that a full filesystem refuses a write in the data dir.
Must never: touch a member process, or leave a mount behind — ``umount`` is idempotent, never
raises, and unmounts lazily (``-l``: a member still holding a file open cannot keep it busy);
the loop device detaches itself when the last reference goes (``mount -o loop`` sets autoclear).

ext4 on a loop device rather than a size-limited tmpfs: fsync is real there (tmpfs's is a
no-op, which would change what the power-loss faults and group commit do), and a full ext4
refuses new blocks at ``write()`` (delayed allocation reserves them there), as the disk of a
deployment does. Measured here: a 16 MiB image fills in ~0.1 s; a write of a new file then
fails with ENOSPC while creating the (empty) file still succeeds (inodes are left).
"""

from __future__ import annotations

import errno
import os
import subprocess

# Room for a soak's journal and snapshots (a CI run's data dir stays under 200 KB: compaction
# every 20 s), small enough that filling it takes a fraction of a second.
DATA_FS_BYTES = 64 * 1024 * 1024
# Filler writes: big chunks fill fast, then smaller ones take the last partial blocks.
_FILL_CHUNKS_BYTES = (1024 * 1024, 4096, 1)
# mkfs and mount of a 64 MiB image take ~0.1 s; a loaded machine gets much more room.
FS_COMMAND_TIMEOUT_S = 30.0
FILLER_NAME = "chaos-filler"
# The subdirectory that is the member's data dir: the filesystem's root holds lost+found,
# which a member must not find in its data dir (and a wiped data dir can be removed and
# made again, which a mount point cannot).
DATA_SUBDIR = "data"


class SmallFsError(RuntimeError):
    """A small filesystem could not be made, mounted or filled."""


def _run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=FS_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SmallFsError(f"{' '.join(cmd)}: {exc}") from exc
    if r.returncode != 0:
        raise SmallFsError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")


def write_refused_with_enospc(directory: str) -> bool:
    """True if writing one block to a new file in ``directory`` fails with ENOSPC (the file
    is removed either way): the proof that the filesystem is really full."""
    path = os.path.join(directory, ".chaos-enospc-probe")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return exc.errno == errno.ENOSPC
    try:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)
        return False
    except OSError as exc:
        return exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
        os.unlink(path)


class SmallFs:
    """``image`` (a sparse file) formatted ext4 and loop-mounted on ``mountpoint``."""

    def __init__(self, image: str, mountpoint: str, size_bytes: int = DATA_FS_BYTES) -> None:
        self.image, self.mountpoint, self.size_bytes = image, mountpoint, size_bytes
        self.mounted = False

    @property
    def data_dir(self) -> str:
        return os.path.join(self.mountpoint, DATA_SUBDIR)

    @property
    def filler(self) -> str:
        return os.path.join(self.mountpoint, FILLER_NAME)

    def mount(self) -> None:
        """Make the image (``-m 0``: no blocks reserved for root, who runs the members, so
        full means full) and mount it; the data dir is created inside."""
        with open(self.image, "wb") as f:
            f.truncate(self.size_bytes)
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", self.image])
        os.makedirs(self.mountpoint, exist_ok=True)
        # discard: blocks freed here (the filler) are freed in the image file too, so a run
        # leaves images of a few hundred KB, not of the size the fault filled.
        _run(["mount", "-o", "loop,discard", self.image, self.mountpoint])
        self.mounted = True
        os.makedirs(self.data_dir, exist_ok=True)

    def fill(self) -> int:
        """Write the filler file until the filesystem refuses a byte (ENOSPC); the bytes
        written. SmallFsError if the writes fail otherwise."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in _FILL_CHUNKS_BYTES:
                block = b"\0" * chunk
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise SmallFsError(f"filling {self.mountpoint}: {exc}") from exc
                        break
            os.fsync(fd)  # the blocks are the filesystem's now, not a reservation
        finally:
            os.close(fd)
        return written

    def unfill(self) -> None:
        """Delete the filler (idempotent)."""
        try:
            os.unlink(self.filler)
        except FileNotFoundError:
            pass

    def free_bytes(self) -> int:
        st = os.statvfs(self.mountpoint)
        return st.f_bavail * st.f_frsize

    def umount(self) -> None:
        """Lazy unmount; never raises (teardown)."""
        if not self.mounted:
            return
        try:
            subprocess.run(["umount", "-l", self.mountpoint], capture_output=True, timeout=FS_COMMAND_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            pass
        self.mounted = False
