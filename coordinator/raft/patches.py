"""Every change we make to pysyncobj's modules, applied only by ``install()``.

Owns: the pinned version (``PYSYNCOBJ_VERSION_REQUIRED``, ``check_pysyncobj_version``) and
``install()``, which checks that version first and then, once per process, replaces:
  - ``syncobj.createJournal``: also accepts a ready Journal object (our DurableJournal);
  - ``pickle`` as syncobj.py and tcp_connection.py see it: refuses everything (nothing of
    ours goes through it any more);
  - TcpConnection's frame reader and writer (``connection.py``: the typed wire, bounded heads,
    bytearray buffers) and its per-connection defaults (including the set of unnamed
    connections that the pre-authentication byte budget reads);
  - TcpConnection's connection timeout: silence counts only while the peer owes an answer
    (``connection.drop_if_unanswered``);
  - ``syncobj.Serializer``: a Replica's snapshots are written on a thread of their own
    (``snapshot_writer.serializer_for``; other serializers stay stock).
Why each one is needed: RAFT.md ("A typed wire", "Bounded frames", "Idle is not dead").
Must never: patch anything at import (importing any coordinator.raft module leaves pysyncobj
stock; a test checks it), or patch a pysyncobj other than the pinned one: every replacement
names that version's internals.
"""

from __future__ import annotations

import threading

import pysyncobj.pickle as _ps_pickle
import pysyncobj.syncobj as _ps
import pysyncobj.tcp_connection as _ps_tcp
import pysyncobj.version
from pysyncobj.journal import Journal

from coordinator.raft import connection, snapshot_writer
from coordinator.raft import wire as raft_wire

PYSYNCOBJ_VERSION_REQUIRED = "0.3.17"


def library_version() -> str:
    """The Raft library's version this process runs: the pinned one (RaftNode refuses others)."""
    return PYSYNCOBJ_VERSION_REQUIRED


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
        _ps.pickle = _NoPickle
        _ps_tcp.pickle = _NoPickle
        _bound_frame_reads()
        # syncobj.py builds its Serializer in SyncObj.__init__, before its tick thread starts
        # (syncobj.py:198, 283): replacing the name is the only way in before a tick runs.
        _ps.Serializer = snapshot_writer.serializer_for
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


# pysyncobj unpickles every Raft frame (tcp_connection.py:291) and every log entry it applies
# (syncobj.py:874, 894, 977, 1419): code execution for anyone who reaches a Raft port or gets
# an entry into the log. Frames are now the typed wire (connection.send_typed and the frame
# reader below); entries are typed too and applied by HardenedSyncObj._SyncObj__doApplyCommand
# without pickle. What is left of pickle in the two modules is refused outright, so a path we
# did not override fails loudly instead of unpickling.
class _NoPickle:
    """What syncobj.py and tcp_connection.py see as ``pickle``: nothing goes through it."""

    @staticmethod
    def dumps(value, protocol=None) -> bytes:
        raise raft_wire.RefusedPickle("the Raft layer pickles nothing: messages and entries are typed")

    @staticmethod
    def loads(data) -> None:
        raise raft_wire.RefusedPickle("the Raft layer unpickles nothing: messages and entries are typed")

    to_bytes = staticmethod(_ps_pickle.to_bytes)


def _bound_frame_reads() -> None:
    conn = _ps_tcp.TcpConnection
    for name, default in connection.CONNECTION_DEFAULTS.items():
        setattr(conn, name, default)
    conn._TcpConnection__processRead = connection.process_read_bounded
    conn._TcpConnection__processParseMessage = connection.parse_message_bounded
    conn.send = connection.send_typed
    conn._TcpConnection__processConnectionTimeout = connection.drop_if_unanswered
    conn.connect = connection.restarting_frame_scan(conn.connect)
    conn.disconnect = connection.restarting_frame_scan(conn.disconnect)
