"""Test and benchmark support: clusters of real processes, and an in-memory one.

Owns: the process supervisor and the clusters built on it (``cluster``: node processes driven
over a control socket; ``grpc_cluster``: real ``fencingd serve`` members), the node control
process (``node_process``, ``control``), and the in-memory cluster that runs the real
servicers over an in-memory Raft node for client tests (``inmemory``, ``inmemory_node``,
``inmemory_faults``).
Must never: ship. It sits beside ``coordinator/``, not inside it, so the wheel leaves it out
(a test lists the wheel's files); the control socket accepts ``propose`` and ``bench``
without authentication and exists only for tests and benchmarks.
"""
