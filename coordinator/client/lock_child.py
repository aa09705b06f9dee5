"""The command ``fencingctl lock`` runs under its lease: started, signalled, stopped, reaped.

Owns: starting CMD in a process group of its own, tied to fencingctl's life (on Linux the
kernel SIGKILLs it if fencingctl dies, even by SIGKILL); passing SIGTERM, SIGINT and SIGHUP
sent to fencingctl on to that group; stopping it when the lease is lost (SIGTERM to the group,
SIGKILL after the grace); killing what is left of the group once CMD has exited; and CMD's
exit status as a shell reports it. Must never: return while CMD still runs, or raise out of a
signal handler once CMD has started (a signal before then ends the wait for the lease by
``Interrupted``, which the lock command turns into an exit without a traceback).

Why its own process group: a supervisor's SIGTERM reaches fencingctl alone; CMD hears it
once, from here, and fencingctl stays alive to wait for it and release the lease only after
CMD is gone. At a terminal (stdin a terminal whose foreground group is fencingctl's), CMD's
group is made the foreground group while it runs, so that CMD can read the terminal (a
background group reading it would be stopped) and Ctrl-C reaches CMD directly, once; the
terminal is handed back when CMD has exited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(BaseException):
    """A forwarded signal arrived before CMD started (fencingctl was waiting for the lease).
    A BaseException, like KeyboardInterrupt: no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(returncode: int) -> int:
    """A Popen returncode as a shell reports it: 128 + N when signal N ended the process."""
    return returncode if returncode >= 0 else 128 - returncode


# CMD is started through this few-line program, not with a preexec_fn: a preexec_fn makes
# subprocess fork a process that has gRPC's threads and fork handlers, which corrupted the
# report of a failed exec now and then. It asks the kernel to SIGKILL it when fencingctl dies
# (Linux's parent-death signal; execve keeps it), checks fencingctl did not die before that,
# and becomes CMD, or exits as the shell would when it cannot (127 not found, 126 otherwise).
_TRAMPOLINE = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    os._exit(125)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as error:
    print(f"fencingctl: lock: cannot run {sys.argv[2]}: {error.strerror or error}", file=sys.stderr, flush=True)
    os._exit(127 if isinstance(error, FileNotFoundError) else 126)
"""


class Child:
    """One CMD's life. ``install()`` before waiting for the lease, then ``granted()``,
    ``start()`` and ``wait()``; ``close()`` in a finally. ``lease_lost`` is the lease's
    on_lost callback (called from its keep-alive thread)."""

    def __init__(self, name: str, *, grace_s: float, say: Callable[[str], None]) -> None:
        self.name = name  # CMD's first word, for messages
        self.grace_s = grace_s
        self._say = say
        self._mode = "waiting"  # waiting (for the lease) -> starting -> running -> done
        self._pending: list[int] = []  # signals that came while CMD was being started
        self._signalled: int | None = None  # the first signal passed on to CMD
        self._lost: Any = None  # the LeaseLost, once the lease is lost
        self._wake = threading.Event()
        self._previous: dict[int, Any] = {}
        self._ttou: Any = None  # SIGTTOU's handler while CMD has the terminal (None: it has not)
        self.process: subprocess.Popen | None = None

    # -- signals ---------------------------------------------------------------------------

    def install(self) -> None:
        for signum in FORWARDED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def close(self) -> None:
        """After CMD is gone (or never started): later signals are only noted, so releasing the
        lease is not cut short; the old handlers return once that is done (``restore``)."""
        self._mode = "done"

    def restore(self) -> None:
        self._give_back_terminal()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # Runs in the main thread between two bytecodes of whatever it was doing.
        if self._mode == "waiting":
            self._mode = "leaving"  # a second signal while leaving the queue is only noted
            raise Interrupted(signum)
        if self._mode == "starting":
            self._pending.append(signum)
        elif self._mode == "running":
            self._forward(signum)
        self._wake.set()

    def _forward(self, signum: int) -> None:
        if self._signalled is None:
            self._signalled = signum
        self._kill_group(signum)

    def _kill_group(self, signum: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:  # the group is empty: nothing left to signal
            pass

    # -- the lease -------------------------------------------------------------------------

    def granted(self) -> None:
        """The lease is held: a signal from now on is for CMD, not for the wait."""
        self._mode = "starting"

    def lease_lost(self, error: Any) -> None:
        self._lost = error
        self._wake.set()

    # -- CMD -------------------------------------------------------------------------------

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        """Start CMD (one that cannot be run exits 126 or 127, as from a shell); signals
        that came meanwhile are passed on at once."""
        # -I -S: the program needs nothing from the environment or site-packages (and CMD's
        # environment reaches CMD unchanged).
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), *argv], env=env, process_group=0,
        )
        self._mode = "running"
        self._take_terminal()
        for signum in self._pending:
            self._forward(signum)
        self._pending.clear()

    def _take_terminal(self) -> None:
        """At a terminal, make CMD's group its foreground group (module docstring)."""
        assert self.process is not None
        try:
            if not os.isatty(0) or os.tcgetpgrp(0) != os.getpgrp():
                return
            # Popen returned after CMD's exec, so its group exists. In the background from
            # now on, fencingctl must not be stopped for writing its messages or for taking
            # the terminal back (CMD itself started with SIGTTOU's default, before this).
            self._ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            os.tcsetpgrp(0, self.process.pid)
        except OSError:  # no terminal after all, or CMD already gone: nothing to hand over
            return
        # CMD may have read the terminal before it was its own, and been stopped for it.
        self._kill_group(signal.SIGCONT)

    def _give_back_terminal(self) -> None:
        if self._ttou is None:
            return
        try:
            os.tcsetpgrp(0, os.getpgrp())
        except OSError:
            pass  # the terminal is gone (hung up): nothing to take back
        signal.signal(signal.SIGTTOU, self._ttou)
        self._ttou = None

    def wait(self, resource: str) -> int:
        """Wait until CMD has exited, stopping it if a signal came or the lease was lost (SIGKILL
        to its group ``grace_s`` after that), then kill what is left of its group. Returns
        CMD's exit status (128 + N for signal N)."""
        process = self.process
        assert process is not None
        def wait_then_wake() -> None:
            process.wait()
            self._wake.set()

        threading.Thread(target=wait_then_wake, name="lock-cmd-wait", daemon=True).start()
        kill_at: float | None = None  # when SIGKILL is due, once CMD is being stopped
        killed = False
        while True:
            self._wake.clear()  # before looking: a wake-up after this is not missed
            if process.poll() is not None:
                break
            now = time.monotonic()
            if kill_at is None:
                if self._lost is not None:
                    self._say(f"{self._lost}; sending SIGTERM to {self.name}")  # names resource and token
                    self._kill_group(signal.SIGTERM)
                    kill_at = now + self.grace_s
                elif self._signalled is not None:
                    name = signal.Signals(self._signalled).name
                    self._say(f"{name} passed on to {self.name}; SIGKILL in {self.grace_s:g} s unless it exits")
                    kill_at = now + self.grace_s
            elif not killed and now >= kill_at:
                self._say(f"{self.name} still running {self.grace_s:g} s after being told to stop; sending SIGKILL")
                self._kill_group(signal.SIGKILL)
                killed = True
            self._wake.wait(None if kill_at is None or killed else max(0.0, kill_at - now))
        self._mode = "done"
        self._give_back_terminal()
        # Whatever CMD started in its group and left behind must not run on without the lease.
        self._kill_group(signal.SIGKILL)
        return exit_status(process.returncode)
