"""pysyncobj is patched only by ``patches.install()``, and only the pinned version.

Importing any ``coordinator.raft`` module must leave pysyncobj stock: patching at import ran
before the version check, so a wrong pysyncobj was already patched by the time a RaftNode
refused it. Each check runs in a fresh interpreter (this one has patched pysyncobj already,
as soon as any test built a node) and compares every attribute of pysyncobj's modules and
of the classes they define, by identity, before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pysyncobj.version
import pytest

from coordinator.raft.node import RaftConfig, RaftNode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every pysyncobj module ours patch or build on; syncobj_admin and batteries are left out
# (the first is a command-line tool, the second imports nothing of ours touches).
_PYSYNCOBJ_MODULES = (
    "config", "dns_resolver", "encryptor", "fast_queue", "journal", "monotonic", "node", "pickle",
    "pipe_notifier", "poller", "serializer", "syncobj", "tcp_connection", "tcp_server", "transport",
    "version",
)

_PRELUDE = textwrap.dedent(
    f"""
    import importlib, json, pkgutil

    MODULES = {_PYSYNCOBJ_MODULES!r}
    MISSING = object()

    def state():
        out = {{}}
        for short in MODULES:
            mod = importlib.import_module("pysyncobj." + short)
            out[mod.__name__] = dict(vars(mod))
            for name, value in vars(mod).items():
                if isinstance(value, type) and value.__module__ == mod.__name__:
                    out[mod.__name__ + "." + name] = dict(vars(value))
        return out

    def changed(before, after):
        return sorted(
            owner + "." + name
            for owner in before
            for name in set(before[owner]) | set(after[owner])
            if before[owner].get(name, MISSING) is not after[owner].get(name, MISSING)
        )

    def import_all_of_raft():
        import coordinator.raft
        names = [info.name for info in pkgutil.walk_packages(coordinator.raft.__path__, "coordinator.raft.")]
        for name in names:
            importlib.import_module(name)
        return names
    """
)

# What install() replaces, and nothing else (patches.py's header lists why).
PATCHED = sorted(
    [
        "pysyncobj.syncobj.createJournal",
        "pysyncobj.syncobj.pickle",
        "pysyncobj.syncobj.Serializer",
        "pysyncobj.tcp_connection.pickle",
        "pysyncobj.tcp_connection.TcpConnection._TcpConnection__processRead",
        "pysyncobj.tcp_connection.TcpConnection._TcpConnection__processParseMessage",
        "pysyncobj.tcp_connection.TcpConnection._TcpConnection__processConnectionTimeout",
        "pysyncobj.tcp_connection.TcpConnection.connect",
        "pysyncobj.tcp_connection.TcpConnection.disconnect",
        "pysyncobj.tcp_connection.TcpConnection.send",
        "pysyncobj.tcp_connection.TcpConnection._frames_scanned_to",
        "pysyncobj.tcp_connection.TcpConnection.on_refused_frame",
        "pysyncobj.tcp_connection.TcpConnection.accepted_at",
        "pysyncobj.tcp_connection.TcpConnection.unnamed_connections",
        "pysyncobj.tcp_connection.TcpConnection.awaiting_answer_since",
        "pysyncobj.tcp_connection.TcpConnection.handshake",
        "pysyncobj.tcp_connection.TcpConnection.bound_incarnation",
    ]
)


def run_fresh(body: str) -> dict:
    """Run ``_PRELUDE + body`` in a new interpreter; ``body`` prints one JSON line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_raft_package_patches_nothing_and_install_patches_what_it_says():
    found = run_fresh(
        """
        before = state()
        names = import_all_of_raft()
        after_import = state()
        from coordinator.raft import patches
        patches.install()
        after_install = state()
        patches.install()  # idempotent: nothing wrapped twice
        again = state()
        print(json.dumps({
            "imported": names,
            "by_import": changed(before, after_import),
            "by_install": changed(after_import, after_install),
            "by_second_install": changed(after_install, again),
        }))
        """
    )
    # The walk really reached every module, the patching ones included.
    assert {"coordinator.raft.node", "coordinator.raft.patches", "coordinator.raft.transport",
            "coordinator.raft.syncobj"} <= set(found["imported"])
    assert found["by_import"] == []
    # The control: the same comparison sees install()'s patches, so the check above can fail.
    assert found["by_install"] == PATCHED
    assert found["by_second_install"] == []


def test_install_refuses_another_pysyncobj_version_before_patching_anything():
    found = run_fresh(
        """
        import pysyncobj.version
        pysyncobj.version.VERSION = "0.3.18"  # what a different pysyncobj would report
        import_all_of_raft()
        before = state()
        from coordinator.raft import patches
        try:
            patches.install()
            refused = ""
        except RuntimeError as exc:
            refused = str(exc)
        print(json.dumps({"refused": refused, "changed": changed(before, state())}))
        """
    )
    assert "requires exactly 0.3.17" in found["refused"]
    assert found["changed"] == []


def test_a_node_refuses_another_pysyncobj_version_before_building_anything(tmp_path, monkeypatch):
    data_dir = tmp_path / "n"
    monkeypatch.setattr(pysyncobj.version, "VERSION", "0.3.18")

    class Unused:  # never reached: the version check comes first
        log_clock_ms = 0

    with pytest.raises(RuntimeError, match="requires exactly 0.3.17"):
        RaftNode(RaftConfig("127.0.0.10:4001", ("127.0.0.11:4001",), str(data_dir)), Unused())
    assert not data_dir.exists()  # no journal, no directory: nothing was built

