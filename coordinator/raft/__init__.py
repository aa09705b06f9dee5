"""The Raft layer: the only code that imports pysyncobj.

Owns: replicating a state machine's commands through a hardened pysyncobj 0.3.17, one concern
per module: ``node`` (the ``RaftNode`` facade and ``RaftConfig``), ``interface`` (the
``StateMachine`` protocol and ``ProposeResult``), ``patches`` (the version pin and every patch
of pysyncobj, by ``install()``), ``transport`` (connection admission, bounded frames),
``syncobj`` (the hardened SyncObj), ``replica`` (the state machine as pysyncobj's consumer),
``snapshot_file``, ``journal``, ``leader_sync``, ``wire``, ``limits`` (the transport's bounds)
and ``fatal``. The gaps listed in PYSYNCOBJ.md are closed here (see ``RAFT.md``).
Must never: import ``coordinator.server`` or ``coordinator.client``, patch pysyncobj at import
(only ``patches.install()`` does, after the version check), interpret a command (it hands
bytes to a state machine), or acknowledge anything not fsynced on a majority.
"""
