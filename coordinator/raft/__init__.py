"""The Raft layer: the only code that imports pysyncobj.

Owns: the durable journal (``journal``), the typed Raft wire (``wire``), leader sync
(``leader_sync``) and the hardened node with its ``RaftNode`` facade (``node``): the
gaps listed in PYSYNCOBJ.md are closed here (see ``RAFT.md``).
Must never: import ``coordinator.server`` or ``coordinator.client``, interpret a command
(it hands bytes to a state machine), or acknowledge anything not fsynced on a majority.
"""
