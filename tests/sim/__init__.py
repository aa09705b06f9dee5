"""Deterministic simulation of the Raft layer (see ``harness.py``)."""
