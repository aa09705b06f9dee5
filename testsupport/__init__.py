"""Test and benchmark support: real node processes driven over a control socket.

Not part of the product API. The gRPC server replaces the control socket for
users; tests keep it because it reaches the raw Raft layer without gRPC cost.
"""
