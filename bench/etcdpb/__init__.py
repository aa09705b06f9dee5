"""Generated Python stubs for the etcd v3 calls bench.compare makes (see rpc.proto)."""
