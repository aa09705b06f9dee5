"""Throwaway Redis and MariaDB servers for the guard tests, each on a unix socket in a temp dir.

Owns: finding each server's binary (a missing one is an error naming the Debian package, never
a skip), starting it with no TCP listener in a directory of its own, waiting for it with a
deadline, and stopping it (TERM, then KILL) and deleting the directory, also after a failed
start. PostgreSQL's counterpart is ``testsupport.postgres``.
Must never: listen on TCP (another engineer's or CI's server may own 6379 or 3306), touch a
server it did not start, or be imported by ``coordinator/`` (not shipped).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

# A fresh server is ready in well under a second here; a machine whose two cores are busy with
# other tests needs far more, and a hung start must still end.
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 20
INSTALL_DB_TIMEOUT_S = 60
POLL_INTERVAL_S = 0.05


class ServerMissing(RuntimeError):
    """No server binary: the message says how to install it."""


def _binary(name: str, package: str) -> str:
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise ServerMissing(f"{name} not found on PATH: install it with `apt-get install -y {package}` "
                            "(as .ci/run does)")
    return path


class _Server:
    """One server process in a temp dir; ``start()`` then ``stop()`` (also after a failed start)."""

    name = "server"

    def __init__(self) -> None:
        self.base = tempfile.mkdtemp(prefix=f"fencing-{self.name}-")
        self.log_path = os.path.join(self.base, "server.log")
        self._proc: subprocess.Popen | None = None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.base,
                                          start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self._proc.returncode} while starting:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready within {START_TIMEOUT_S} s:\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def stop(self) -> None:
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
                try:
                    self._proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(STOP_TIMEOUT_S)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(log.readlines()[-lines:])
        except OSError:
            return "(no server log)"


class RedisServer(_Server):
    """``redis-server`` with no persistence (the guard tests test the script, not the disk)."""

    name = "redis"

    def __init__(self) -> None:
        self.binary = _binary("redis-server", "redis-server")
        super().__init__()
        self.socket_path = os.path.join(self.base, "redis.sock")

    def _command(self) -> list[str]:
        return [self.binary, "--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700",
                "--dir", self.base, "--save", "", "--appendonly", "no", "--databases", "1024"]  # 1 test: 1 db

    def _ready(self) -> bool:
        if not os.path.exists(self.socket_path):
            return False
        import redis

        try:
            with redis.Redis(unix_socket_path=self.socket_path, socket_timeout=5) as client:
                return bool(client.ping())
        except redis.ConnectionError:
            return False

    def new_database(self) -> int:
        """A fresh database number (of 1024): no test sees another's keys."""
        self._databases = getattr(self, "_databases", 0) + 1
        if self._databases >= 1024:
            raise RuntimeError("the test Redis server ran out of its 1024 databases")
        return self._databases

    def client(self, db: int = 0, **kwargs):
        import redis

        return redis.Redis(unix_socket_path=self.socket_path, db=db, socket_timeout=30, **kwargs)


# Redis Cluster also listens on port + 10000 (its bus), so the port must be at most 55535: the
# kernel's ephemeral range reaches 60999 and once gave 5xxxx ports that redis refused.
CLUSTER_PORT_MAX = 65535 - 10000


def _free_cluster_port() -> int:
    """A port of 127.0.0.1 free now, with its bus port (+10000) free too. Another process could
    take either before the server binds; its start then fails and says so."""
    for _ in range(100):
        port = random.randint(20000, CLUSTER_PORT_MAX)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free pair of ports (P, P + 10000) with P <= {CLUSTER_PORT_MAX} for redis-cluster")


class RedisClusterNode(RedisServer):
    """A one-node Redis Cluster (all 16384 slots on this node), for the guard's cluster test.
    A cluster client finds nodes by address, so this one listens on a free port of 127.0.0.1."""

    name = "redis-cluster"

    def __init__(self) -> None:
        super().__init__()
        self.port = _free_cluster_port()

    def _command(self) -> list[str]:
        command = super()._command()
        command[command.index("--port") + 1] = str(self.port)
        return command + ["--bind", "127.0.0.1", "--cluster-enabled", "yes",
                          "--cluster-config-file", os.path.join(self.base, "nodes.conf"), "--databases", "1"]

    def start(self) -> None:
        super().start()
        client = self.client()
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + START_TIMEOUT_S
        while client.cluster("info")["cluster_state"] != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the one-node cluster not ok within {START_TIMEOUT_S} s:\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)
        client.close()


class MariaDBServer(_Server):
    """``mariadbd`` with a fresh data directory from ``mariadb-install-db``; root without a
    password (the socket's directory is the only way in)."""

    name = "mariadb"

    def __init__(self) -> None:
        self.binary = _binary("mariadbd", "mariadb-server")
        self.install_db = _binary("mariadb-install-db", "mariadb-server")
        super().__init__()
        self.data_dir = os.path.join(self.base, "data")
        self.socket_path = os.path.join(self.base, "mysqld.sock")
        self._databases = 0

    def start(self) -> None:
        proc = subprocess.run(
            [self.install_db, "--no-defaults", f"--datadir={self.data_dir}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"],
            capture_output=True, text=True, timeout=INSTALL_DB_TIMEOUT_S, cwd=self.base,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed (exit {proc.returncode}): {proc.stdout}{proc.stderr}")
        super().start()

    def _command(self) -> list[str]:
        # --user=root: the tests run as root in CI, and mariadbd refuses root without it.
        return [self.binary, "--no-defaults", f"--datadir={self.data_dir}", f"--socket={self.socket_path}",
                "--skip-networking", "--user=root", f"--pid-file={os.path.join(self.base, 'mysqld.pid')}",
                f"--log-error={self.log_path}", "--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M",
                "--max-connections=60", "--skip-log-bin", "--innodb-lock-wait-timeout=30",
                # Throwaway data: stop without flushing the buffer pool (the directory goes next).
                "--innodb-fast-shutdown=2"]

    def _ready(self) -> bool:
        if not os.path.exists(self.socket_path):
            return False
        import pymysql

        try:
            pymysql.connect(unix_socket=self.socket_path, user="root", connect_timeout=5).close()
            return True
        except pymysql.err.OperationalError:
            return False

    def connect_args(self, database: str | None = None) -> dict:
        return {"unix_socket": self.socket_path, "user": "root", "database": database, "connect_timeout": 10}

    def new_database(self) -> str:
        """A fresh empty database's name: no test sees another's tables."""
        import pymysql

        self._databases += 1
        name = f"test_{self._databases}"
        with pymysql.connect(**self.connect_args(), autocommit=True) as admin, admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        return name
