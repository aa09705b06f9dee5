"""Every change we make to pysyncobj's modules, applied only by ``install()``.

Owns: the pinned version (``PYSYNCOBJ_VERSION_REQUIRED``, ``check_pysyncobj_version``) and
``install()``, which checks that version first and then, once per process, replaces:
  - ``syncobj.createJournal``: also accepts a ready Journal object (our DurableJournal);
  - ``zlib`` as tcp_connection.py sees it: stored blocks for small messages, bounded inflate;
  - ``pickle`` as syncobj.py and tcp_connection.py see it: plain data in, protocol 5 out;
  - TcpConnection's frame reader (``transport.py``: bounded heads, a bytearray buffer) and
    its per-connection defaults.
Why each one is needed: RAFT.md ("No deflate on the Raft wire", "Peer input is plain data",
"Bounded frames").
Must never: patch anything at import (importing any coordinator.raft module leaves pysyncobj
stock; a test checks it), or patch a pysyncobj other than the pinned one: every replacement
names that version's internals.
"""

from __future__ import annotations

import threading
import zlib

import pysyncobj.pickle as _ps_pickle
import pysyncobj.syncobj as _ps
import pysyncobj.tcp_connection as _ps_tcp
import pysyncobj.version
from pysyncobj.journal import Journal

from coordinator.raft import transport
from coordinator.raft import wire as raft_wire

PYSYNCOBJ_VERSION_REQUIRED = "0.3.17"

_install_lock = threading.Lock()
_installed = False


def check_pysyncobj_version(found: str | None = None) -> None:
    """Refuse to run on any pysyncobj but the one whose internals we patch."""
    found = pysyncobj.version.VERSION if found is None else found
    if found != PYSYNCOBJ_VERSION_REQUIRED:
        raise RuntimeError(
            f"pysyncobj {found} is installed, but this coordinator requires exactly "
            f"{PYSYNCOBJ_VERSION_REQUIRED}: its Raft fixes override that version's internals "
            f"(pip install pysyncobj=={PYSYNCOBJ_VERSION_REQUIRED})"
        )


def install() -> None:
    """Check the pinned version, then patch pysyncobj (once per process; later calls only check)."""
    global _installed
    check_pysyncobj_version()
    with _install_lock:
        if _installed:
            return
        _accept_journal_objects()
        _ps_tcp.zlib = _RaftWireZlib
        _ps.pickle = _RaftWirePickle
        _ps_tcp.pickle = _RaftWirePickle
        _bound_frame_reads()
        _installed = True


def _accept_journal_objects() -> None:
    # pysyncobj builds its journal with a module-level createJournal(conf.journalFile)
    # (syncobj.py:161) that only knows paths. Accepting a ready Journal object there is
    # the narrowest way in; paths and None keep the stock behaviour.
    stock = _ps.createJournal

    def create_journal(journal_file):
        if isinstance(journal_file, Journal):
            return journal_file
        return stock(journal_file)

    _ps.createJournal = create_journal


# pysyncobj deflates every Raft message (tcp_connection.py:144); small ones go out as
# stored zlib blocks instead, the same format for any peer (wire.py says why).
class _RaftWireZlib:
    """What tcp_connection.py sees as ``zlib``: stored blocks for small messages."""

    decompress = staticmethod(raft_wire.bounded_inflate)  # its errors drop the connection
    error = zlib.error

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        if len(data) < raft_wire.ZLIB_STORED_BELOW_BYTES:
            return raft_wire.zlib_stored(data)
        return zlib.compress(data, level)  # large snapshot chunks: worth compressing


# pysyncobj unpickles every Raft frame (tcp_connection.py:291) and every log entry it applies
# (syncobj.py:874, 894, 977, 1419): code execution for anyone who reaches a Raft port or gets
# an entry into the log. What pysyncobj itself sends and stores is plain data, so both modules
# get an unpickler that refuses every global (raft_wire.plain_loads says why that suffices),
# and what we send is pickled with protocol 5, which needs no global for bytes.
# A refused frame drops the connection (tcp_connection.py:293-296); entries are checked
# further by HardenedSyncObj._SyncObj__doApplyCommand (syncobj.py in this package).
class _RaftWirePickle:
    """What syncobj.py and tcp_connection.py see as ``pickle``: plain data in, protocol 5 out."""

    @staticmethod
    def dumps(value, protocol=None) -> bytes:  # pysyncobj's signature; it ignores protocol too
        return raft_wire.dumps(value)

    loads = staticmethod(raft_wire.plain_loads)
    to_bytes = staticmethod(_ps_pickle.to_bytes)


def _bound_frame_reads() -> None:
    conn = _ps_tcp.TcpConnection
    for name, default in transport.CONNECTION_DEFAULTS.items():
        setattr(conn, name, default)
    conn._TcpConnection__processRead = transport.process_read_bounded
    conn._TcpConnection__processParseMessage = transport.parse_message_bounded
    conn.connect = transport.restarting_frame_scan(conn.connect)
    conn.disconnect = transport.restarting_frame_scan(conn.disconnect)
