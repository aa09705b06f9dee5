"""Chaos suite: fault injection against a real cluster, a recorded history, and its checker.

``chaos.history`` defines the JSONL record format, ``chaos.check`` checks a recorded history
against the invariants of DESIGN §3 (run it as ``python -m chaos.check HISTORY.jsonl``), and
``chaos.linearizability`` is the per-key register search it uses, ``chaos.watch_check`` its
Watch rule (every acknowledged change seen once, in order, by each watcher).
"""
