"""Test and benchmark support: real member processes under one supervisor, never shipped.

Owns: supervisor.py (spawn, stop, kill, pause, power-loss, reap, ports, the one ``wait_until``)
and the clusters on it — cluster.py (node_process over the control socket), grpc_cluster.py
(``fencingd serve``) — plus the fake cluster for client tests. Must never: be imported by
``coordinator`` (tests/test_layers.py) or be built into the wheel (tests/test_wheel.py).
The control socket is not a product API: tests keep it because it reaches the raw Raft layer
without gRPC cost.
"""
