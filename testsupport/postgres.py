"""A throwaway PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` on a unix socket in a temp dir.

Owns: finding the server binaries, making a cluster owned by a non-root user (PostgreSQL
refuses to run as root, and CI runs tests as root), starting it with a deadline on
readiness, making a fresh database per test, and stopping and deleting it all afterwards.
Must never: listen on TCP (another engineer's or CI's server may own 5432), touch a cluster
it did not make, or be imported by ``coordinator/`` (not shipped).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile

# The Debian package puts the binaries outside PATH, one directory per major version.
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin: "
    "install them with `apt-get install -y postgresql` (as .ci/run does)"
)
# Readiness and shutdown deadlines: a fresh cluster starts in about a second; a machine whose
# two cores are busy with other tests needs far more, and a hung start must still end.
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
INITDB_TIMEOUT_S = 120
SUPERUSER = "postgres"
# When the tests run as root, the cluster belongs to this account (Debian has it everywhere).
UNPRIVILEGED_USER = "nobody"


class PostgresMissing(RuntimeError):
    """No server binaries: the message says how to install them."""


def find_bindir() -> str:
    """The directory holding initdb and pg_ctl (PATH first, then Debian's newest version)."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(on_path))
    candidates = [d for d in glob.glob(DEBIAN_BINDIRS) if os.path.exists(os.path.join(d, "pg_ctl"))]
    if not candidates:
        raise PostgresMissing(INSTALL_HINT)
    return max(candidates, key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0)


def _unprivileged_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, the test server needs the account {UNPRIVILEGED_USER!r} (PostgreSQL refuses root), "
            f"and there is none: useradd --system {UNPRIVILEGED_USER}"
        ) from None


class PostgresServer:
    """One temporary cluster; ``start()`` then ``stop()`` (also after a failed start)."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.base = tempfile.mkdtemp(prefix="fencing-pg-")  # under /tmp: reachable by the unprivileged user
        self.socket_dir = self.base
        self.data_dir = os.path.join(self.base, "data")
        self.log_path = os.path.join(self.base, "server.log")
        self._user = _unprivileged_user() if os.geteuid() == 0 else None
        self._started = False
        self._databases = 0

    def start(self) -> None:
        if self._user is not None:
            os.chown(self.base, self._user.pw_uid, self._user.pw_gid)
        os.chmod(self.base, 0o755)  # the socket's directory: the tests connect as another user
        self._run("initdb", "-D", self.data_dir, "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync", timeout=INITDB_TIMEOUT_S)
        with open(os.path.join(self.data_dir, "postgresql.conf"), "a") as conf:
            # Unix socket only, in our own directory; trust auth is then limited to this machine's
            # users who can reach that directory.
            conf.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{self.socket_dir}'\n")
            conf.write("max_connections = 30\nshared_buffers = 16MB\n")  # small: the machine is shared
        self._started = True
        self._run("pg_ctl", "-D", self.data_dir, "-l", self.log_path, "-w", "-t", str(START_TIMEOUT_S),
                  "start", timeout=START_TIMEOUT_S + 10)

    def stop(self) -> None:
        try:
            # No pid file: the start failed (its error is the one to see) or the server is gone.
            if self._started and os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
                self._run("pg_ctl", "-D", self.data_dir, "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S),
                          "stop", timeout=STOP_TIMEOUT_S + 10)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def conninfo(self, dbname: str = "postgres", **extra: str) -> str:
        """A libpq connection string for ``dbname`` on this server's socket."""
        parts = {"host": self.socket_dir, "user": SUPERUSER, "dbname": dbname, "connect_timeout": "10", **extra}
        return " ".join(f"{key}={value}" for key, value in parts.items())

    def new_database(self) -> str:
        """A fresh empty database's connection string: no test sees another's tables."""
        import psycopg  # here, so that a missing PostgreSQL is reported before a missing driver

        self._databases += 1
        name = f"test_{self._databases}"
        with psycopg.connect(self.conninfo(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.conninfo(name)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path) as log:
                return "".join(log.readlines()[-lines:])
        except OSError:
            return "(no server log)"

    def _run(self, program: str, *args: str, timeout: float) -> None:
        user = {} if self._user is None else {"user": self._user.pw_uid, "group": self._user.pw_gid}
        proc = subprocess.run(
            [os.path.join(self.bindir, program), *args], capture_output=True, text=True,
            timeout=timeout, cwd=self.base, **user,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{program} {args[-1]} failed (exit {proc.returncode}): {proc.stdout}{proc.stderr}\n"
                f"server log:\n{self.log_tail()}"
            )
