"""The API layer: the gRPC code generated from ``proto/`` (package ``fencing.v1``).

Owns: nothing written by hand. ``tests/test_proto_generated.py`` regenerates the code and
fails when it differs from what is committed.
Must never: be edited by hand, or import another ``coordinator`` layer.

Modules (one job each; ``tests/test_layers.py`` checks this map against the files):

    v1.fencing_pb2       the messages of ``proto/coordinator/api/v1/fencing.proto``
    v1.fencing_pb2_grpc  its services' stubs and servicer bases
"""
