"""The API layer: the wire contract ``v1/fencing.proto`` (package ``fencing.v1``) and the gRPC
code generated from it.

Owns: a copy of the contract's one source, ``proto/coordinator/api/v1/fencing.proto``, shipped
in the wheel as package data so that a service in another language finds it beside the
installed package (README "From any language"); nothing else written by hand.
``tests/test_proto_generated.py`` regenerates the code from ``proto/`` and fails when it, or
the copy, differs from what is committed.
Must never: be edited by hand, or import another ``coordinator`` layer.

Modules (one job each; ``tests/test_layers.py`` checks this map against the files):

    v1.fencing_pb2       the messages of ``v1/fencing.proto``
    v1.fencing_pb2_grpc  its services' stubs and servicer bases
"""
