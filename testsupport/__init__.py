"""Test and benchmark support: real member processes under one supervisor, and an in-memory
cluster; never shipped.

Owns: ``supervisor`` (spawn, stop, kill, pause, power-loss, reap, ports, the one
``wait_until``) and the clusters built on it — ``cluster`` (``node_process`` children driven
over the ``control`` socket) and ``grpc_cluster`` (real ``fencingd serve`` members; the chaos
suite's cluster derives from it) — plus the in-memory cluster that runs the real servicers
over an in-memory Raft node for client tests (``inmemory``, ``inmemory_node``,
``inmemory_faults``); for the guard tests, throwaway PostgreSQL (``postgres``), Redis and
MariaDB (``store_servers``) servers, and the stores the contract tests run on
(``guard_stores`` for the SQL guards' contract, ``conformance_stores`` for every guard's).
Must never: be imported by ``coordinator`` (tests/test_layers.py) or be built into the wheel
(tests/test_wheel.py). The control socket accepts ``propose`` and ``bench`` without
authentication: it exists only for tests and benchmarks, which reach the raw Raft layer
through it without gRPC cost.
"""
