"""Fencing coordinator: leases with fencing tokens on a Raft-replicated state machine."""

__version__ = "0.1.0"
