"""The calls the member prototypes serve (bench/_loop_node.py, bench/_front_node.py): for each,
the command built from its checked fields and the reply built from the applied result, as the
shipped servicers (coordinator/server/service.py) build them. Benchmark-only."""

from __future__ import annotations

from coordinator.api.v1 import fencing_pb2 as pb
from coordinator.core import commands

# rpc -> (the service it belongs to, the command builder)
RPCS = {
    "Acquire": ("Lease", commands.acquire),
    "Release": ("Lease", commands.release),
    "Write": ("FencedStore", commands.write),
}


def port_plus(address: str, offset: int) -> str:
    """``address`` (host:port) with ``offset`` added to its port: where a prototype listens."""
    host, port = address.rsplit(":", 1)
    return f"{host}:{int(port) + offset}"


def build(rpc: str, fields: dict) -> commands.Command:
    """The command of ``rpc`` for the fields ``_checked_request`` returned."""
    return RPCS[rpc][1](**fields, stamp_ms=0)


def reply(rpc: str, header: pb.ResponseHeader, result: dict):
    """The response message of ``rpc`` for its applied result."""
    if rpc == "Acquire":
        return pb.AcquireResponse(header=header, token=result["token"], lease_id=result["token"],
                                  expires_at_ms=result["expires_at_ms"])
    if rpc == "Release":
        return pb.ReleaseResponse(header=header, released=result["released"], hwm=result["hwm"])
    return pb.WriteResponse(header=header, version=result["version"], hwm=result["hwm"])


def servicer(base, method):
    """An instance of ``base`` (a generated servicer class) whose calls listed in ``RPCS`` are
    ``method(rpc)`` (a function of self, request, context); its other calls stay unimplemented."""
    names = [rpc for rpc, (service, _) in RPCS.items() if base.__name__ == f"{service}Servicer"]
    return type(base.__name__, (base,), {rpc: method(rpc) for rpc in names})()
