"""Every example in the README runs as written, against real ``fencingd dev`` clusters.

Every fenced block is accounted for, or the test fails: ``sh`` blocks run, ``python``
blocks run, ``toml`` blocks go through ``fencingd check-config``, and a block that cannot
run here is listed in NOT_RUN with the reason. A new block that is none of these fails.

An ``sh`` block is fed, unchanged, to one ``bash`` on its stdin, as a paste into a terminal
would: one shell, its sleeps real, the commands in order. ``fencingctl`` and ``fencingd``
are this checkout's console scripts on PATH, and FENCING_ENDPOINTS names the test's
``fencingd dev`` (the blocks themselves name no endpoints, like a user's paste against
``fencingd dev`` on its default ports). What a block shows is checked per command:

- ``CMD  # token 1, version 2: ...``: ``token``/``version``/``value``/``hwm`` with a value
  before the first ``:`` are fields the command's output table must show;
- a line ``# → TEXT   (exit N)`` under a command is a line that command must print
  (stdout or stderr), and its exit status; a command without ``(exit N)`` must exit 0.

Python blocks run as scripts in the directory ``fencingd dev`` was started in (so
``fencing-dev-data/token-signing.pub`` is the cluster's key); the only change made to one is
the dev cluster's default addresses (127.0.0.1:7100-7102) swapped for the test cluster's.
A block must exit 0 (the blocks assert what they show), and one that catches StaleToken must
have printed the refusal: the stale write really was refused, not skipped.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from coordinator.client import fencingctl as cli_ctl
from coordinator.server.fencingd import DEV_METRICS_PORT_OFFSET, DEV_RAFT_PORT_OFFSET, port_free

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ("token", "version", "value", "hwm")
# What ``fencingd dev`` listens on by default, as the README's Python blocks spell it.
DEV_ENDPOINTS = ("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102")
# Three fresh Python processes, an election and a read barrier on a shared 2-core machine.
DEV_START_S = 90.0
# The longest block sleeps a few seconds; each fencingctl start costs ~1-2 s here.
BLOCK_TIMEOUT_S = 180.0

# Blocks that cannot run here, by their first line, with the reason. A listed block that is no
# longer in the README fails too, so this list cannot go stale.
NOT_RUN = {
    ("sh", "pip install -e '.[server]' && fencingd dev"):
        "installs into the environment the tests run in; the `fencingd dev` half is what every "
        "cluster in this file is",
    ("sh", "pip install -e '.[server,test,bench]' && python -m pytest -q"):
        "installs into this environment and runs this very test suite",
    ("toml", "# principals.toml — tokens are stored only as sha256 (printf %s \"$TOKEN\" | sha256sum)"):
        "its token_sha256 values are placeholders for the reader's own hashes",
    ("js", "// A Node.js service on the fencing coordinator's gRPC API, with no client library of ours:"):
        "examples/node/fencing-example.js: tests/test_other_language.py checks the block is that file and runs it",
    ("console", "$ cd examples/node && npm ci"):
        "a run of that Node.js example: tests/test_other_language.py runs it and checks these lines against its output",
}
# sh blocks whose numbers (tokens count from 1) need a cluster nobody else has used.
FRESH_CLUSTER = {"fencingctl acquire orders/7 --ttl-ms 2000 --holder worker-a"}


def readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block, in README order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", readme(), re.S | re.M)


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def needs_fresh(block: str) -> bool:
    return first_line(block).split("  #")[0].strip() in FRESH_CLUSTER


def runnable(language: str) -> list[str]:
    return [text for lang, text in blocks() if lang == language and (lang, first_line(text)) not in NOT_RUN]


# -- reading a sh block -----------------------------------------------------------------------


def commands(block: str) -> list[dict]:
    """[{line, expect: {field: value}, prints: [line], exit}] for every command of ``block``."""
    out: list[dict] = []
    for line in block.splitlines():
        if line.startswith("# → "):
            assert out, f"output shown before any command: {line!r}"
            shown = line[len("# → "):]
            m = re.fullmatch(r"(.*?)\s+\(exit (\d+)\)", shown)
            if m:
                shown, out[-1]["exit"] = m.group(1), int(m.group(2))
            out[-1]["prints"].append(shown)
            continue
        if not line.strip() or line.startswith("#"):
            continue
        command, _, comment = line.partition("  #")
        expect = {}
        for piece in comment.split(":")[0].split(","):
            m = re.fullmatch(r"\s*(\w+) (\S+)\s*", piece)
            if m and m.group(1) in FIELDS:
                expect[m.group(1)] = m.group(2)
        out.append({"line": command.strip(), "expect": expect, "prints": [], "exit": 0})
    return out


def test_a_sh_block_is_read_into_checks():
    parsed = commands(
        "fencingctl write r k v --token 2   # version 1, hwm 2: prose\n"
        "sleep 4                            # a pause\n"
        "# a comment line\n"
        "fencingctl write r k v --token 1\n"
        "# → fencingctl: refused: token 1 is stale   (exit 3)\n"
    )
    assert parsed == [
        {"line": "fencingctl write r k v --token 2", "expect": {"version": "1", "hwm": "2"}, "prints": [], "exit": 0},
        {"line": "sleep 4", "expect": {}, "prints": [], "exit": 0},
        {"line": "fencingctl write r k v --token 1", "expect": {}, "prints": ["fencingctl: refused: token 1 is stale"],
         "exit": 3},
    ]


def test_every_readme_block_is_run_or_listed_with_a_reason():
    seen = {(lang, first_line(text)) for lang, text in blocks()}
    for lang, text in blocks():
        assert lang in ("sh", "python", "toml") or (lang, first_line(text)) in NOT_RUN, (
            f"README block of language {lang!r} is neither run by this test nor listed in NOT_RUN:\n{text}")
    stale = [key for key in NOT_RUN if key not in seen]
    assert not stale, f"NOT_RUN lists blocks the README no longer has: {stale}"
    assert sum(map(needs_fresh, runnable("sh"))) == len(FRESH_CLUSTER), "FRESH_CLUSTER names a block no longer there"


def test_the_first_example_shows_a_stale_write_refused_after_a_real_pause():
    """The first screen's point, checked on its text: worker-a's lease has expired (a real
    sleep longer than its TTL) before worker-b acquires, and worker-a's late write is refused."""
    transcript = next(t for t in runnable("sh") if needs_fresh(t))
    steps = commands(transcript)
    lines = [s["line"] for s in steps]
    ttl_ms = int(re.search(r"--ttl-ms (\d+) --holder worker-a", lines[0]).group(1))
    sleep = next((i for i, line in enumerate(lines) if line.startswith("sleep ")), None)
    assert sleep is not None, "worker-a's pause must be a real `sleep` in the block, not a comment"
    assert float(lines[sleep].split()[1]) * 1000 >= ttl_ms + 2000, (
        "worker-a must pause past its TTL plus the 1 s a lease may outlast it (README Guarantees), "
        "plus a margin")
    takeover = next(i for i, line in enumerate(lines) if "--holder worker-b" in line)
    assert sleep < takeover
    refused = [s for s in steps if s["exit"] == 3]
    assert refused and "--token 1" in refused[0]["line"] and "is stale" in refused[0]["prints"][0]
    assert any(s["exit"] == 2 for s in steps), "the first screen also shows a malformed token refused"


# -- fencingd dev, as a user runs it ----------------------------------------------------------


def user_env(**extra: str) -> dict[str, str]:
    """PATH with this checkout's console scripts first, importing this checkout."""
    bindir = os.path.dirname(sys.executable)
    for script in ("fencingd", "fencingctl"):
        assert os.path.exists(os.path.join(bindir, script)), (
            f"{script} is not installed beside {sys.executable}: pip install -e '.[server,test]'")
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])), **extra}


def free_base_port() -> int:
    offsets = (0, DEV_RAFT_PORT_OFFSET, DEV_METRICS_PORT_OFFSET)
    start = (os.getpid() * 7919 + time.monotonic_ns()) % 20_000
    for attempt in range(300):
        base = 21_000 + (start + attempt * 331) % 20_000
        if all(port_free("127.0.0.1", base + o + i) for o in offsets for i in range(3)):
            return base
    raise RuntimeError("no free port range for fencingd dev")


class DevCluster:
    """``fencingd dev --base-port N`` started in ``directory``; Ctrl-C (SIGINT) stops it."""

    def __init__(self, directory: str):
        self.directory = directory
        self.output: list[str] = []
        for _ in range(3):  # another test may take the ports between the check and the bind
            self.proc = subprocess.Popen(
                ["fencingd", "dev", "--base-port", str(free_base_port())], cwd=directory, env=user_env(),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            )
            self.endpoints = self._endpoints()
            if self.endpoints:
                return
            if "ports in use" not in "".join(self.output):
                break
        raise AssertionError("fencingd dev did not start:\n" + "".join(self.output))

    def _endpoints(self) -> str | None:
        lines: queue.Queue[str | None] = queue.Queue()

        def pump(stream):
            for line in stream:
                self.output.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, args=(self.proc.stdout,), daemon=True).start()
        deadline = time.monotonic() + DEV_START_S
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=30)
                return None
            if line.startswith("ENDPOINTS "):
                return line.split()[1]
        self.stop()
        raise AssertionError(f"fencingd dev not up within {DEV_START_S} s:\n" + "".join(self.output))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def shared_dev(tmp_path_factory):
    cluster = DevCluster(str(tmp_path_factory.mktemp("readme-dev")))
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_dev(tmp_path_factory):
    cluster = DevCluster(str(tmp_path_factory.mktemp("readme-fresh")))
    yield cluster
    cluster.stop()


# -- the sh blocks ----------------------------------------------------------------------------


def table(output: str) -> dict[str, str]:
    rows = {}
    for line in output.splitlines():
        key, _, value = line.partition("  ")
        rows[key.strip()] = value.strip()
    return rows


# bash -x prints this before each command it runs, with the previous command's exit status:
# that splits one shell's output into each command's part without touching the block.
TRACE = "@@readme@@"


def paste(block: str, cwd: str, endpoints: str) -> list[tuple[str, str, int]]:
    """Run ``block`` in one bash, as pasted; [(traced command, its output, its exit)]."""
    # The prelude only names the trace prefix (bash ignores PS4 from the environment as root).
    script = f"PS4='{TRACE} $? {TRACE} '\n" + block
    # One pipe for stdout and stderr: the trace lines and each command's output stay in order.
    proc = subprocess.run(["bash", "-x", "-s"], input=script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, cwd=cwd, timeout=BLOCK_TIMEOUT_S,
                          env=user_env(**{cli_ctl.ENDPOINTS_ENV: endpoints}))
    parts = re.split(rf"^{TRACE} (\d+) {TRACE} (.*)\n", proc.stdout, flags=re.M)
    # parts: [before the first command, status before cmd1, cmd1, output1, status before cmd2, ...]
    traced = [(parts[i + 1], parts[i + 2]) for i in range(1, len(parts), 3)]
    statuses = [int(parts[i]) for i in range(4, len(parts), 3)] + [proc.returncode]
    return [(cmd, out, status) for (cmd, out), status in zip(traced, statuses, strict=True)]


def check_block(block: str, cwd: str, endpoints: str) -> None:
    expected = commands(block)
    ran = paste(block, cwd, endpoints)
    assert len(ran) == len(expected), f"the block ran {len(ran)} commands, the test read {len(expected)}: {ran}"
    for step, (traced, output, status) in zip(expected, ran, strict=True):
        assert shlex.split(step["line"].split("  #")[0])[0] == shlex.split(traced)[0], (step, traced)
        assert status == step["exit"], f"{step['line']}: exit {status}, README says {step['exit']}:\n{output}"
        for shown in step["prints"]:
            assert shown in output.splitlines(), f"{step['line']} did not print {shown!r}:\n{output}"
        rows = table(output)
        for field, value in step["expect"].items():
            assert rows.get(field) == value, f"{step['line']}: {field} {rows.get(field)!r}, README says {value}"


def test_the_first_example_runs_as_pasted_on_a_fresh_fencingd_dev(fresh_dev):
    (transcript,) = [t for t in runnable("sh") if needs_fresh(t)]
    check_block(transcript, fresh_dev.directory, fresh_dev.endpoints)


@pytest.mark.parametrize("index", range(len([t for t in runnable("sh") if not needs_fresh(t)])))
def test_a_readme_sh_block_runs_as_pasted(index, shared_dev):
    block = [t for t in runnable("sh") if not needs_fresh(t)][index]
    check_block(block, shared_dev.directory, shared_dev.endpoints)


def test_the_readme_shows_every_client_and_the_lock_command():
    shown = "\n".join(runnable("python"))
    for name in ("FencingClient(", "AsyncFencingClient(", ".lock(", "SqliteGuard(", "except StaleToken"):
        assert name in shown, f"no README Python block uses {name}"
    assert any(line.startswith("fencingctl lock ") for t in runnable("sh") for line in t.splitlines()), (
        "no README sh block runs `fencingctl lock`")
    for block in runnable("python"):
        if "FencingClient(" in block:
            assert all(e in block for e in DEV_ENDPOINTS), f"a block names other endpoints:\n{block}"


# -- the toml blocks --------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(runnable("toml"))))
def test_a_readme_toml_block_is_a_configuration_fencingd_accepts(index, tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(runnable("toml")[index], encoding="utf-8")
    # Values only: the files it names live on the reader's machine.
    proc = subprocess.run([sys.executable, "-m", "coordinator.server.fencingd", "check-config", "--values-only",
                           str(path)], capture_output=True, text=True, timeout=60, env=user_env())
    assert proc.returncode == 0 and proc.stdout == f"{path}: ok\n", proc.stderr


# -- the Python blocks ------------------------------------------------------------------------


def _with_endpoints(block: str, endpoints: list[str]) -> str:
    for dev, real in zip(DEV_ENDPOINTS, endpoints, strict=True):
        block = block.replace(dev, real)
    # Never reach a dev cluster someone else runs on this machine.
    assert "127.0.0.1:710" not in block, block
    return block


def _store_env(block: str, request) -> dict[str, str]:
    """A guard block's store, fresh, named the way the block reads it (a server the tests start)."""
    if "psycopg.connect" in block:
        server = request.getfixturevalue("postgres_server")
        dbname = server.new_database().split("dbname=")[1].split()[0]
        return {"PGHOST": server.socket_dir, "PGUSER": "postgres", "PGDATABASE": dbname}
    if "pymysql.connect" in block:
        server = request.getfixturevalue("mariadb_server")
        return {"MYSQL_UNIX_PORT": server.socket_path, "MYSQL_DATABASE": server.new_database()}
    if "redis.Redis" in block:
        server = request.getfixturevalue("redis_server")
        return {"REDIS_URL": f"unix://{server.socket_path}?db={server.new_database()}"}
    return {}


@pytest.mark.parametrize("index", range(len(runnable("python"))))
def test_a_readme_python_block_runs_as_written(index, shared_dev, request):
    block = runnable("python")[index]
    script = _with_endpoints(block, shared_dev.endpoints.split(","))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
                          cwd=shared_dev.directory, env=user_env(**_store_env(block, request)))
    assert proc.returncode == 0, f"README Python block {index} failed:\n{block}\n{proc.stdout}{proc.stderr}"
    if "except StaleToken" in block:
        assert "is stale" in proc.stdout, f"README Python block {index} printed no refusal:\n{proc.stdout}"


def test_every_guard_has_a_readme_block_and_a_row_in_the_protection_table():
    python = runnable("python")
    text = readme()
    table = text.split("### What each guard protects", 1)[1].split("\n## ", 1)[0]
    for guard in ("SqliteGuard", "PostgresGuard", "MySQLGuard", "RedisGuard"):
        assert any(f"{guard}(" in block for block in python), f"no runnable README block uses {guard}"
        assert f"| `{guard}` |" in table, f"{guard} has no row in the README's protection table"
