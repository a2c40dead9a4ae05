"""Python stubs for kvmesh's protos, generated at test time with grpc_tools.protoc into a
temp dir and imported, plus the standard gRPC health protocol (grpc.health.v1) under a
file name of our own, so that the generated module cannot clash with the grpc package
and the tests need no grpcio-health-checking."""

import importlib
import os
import sys
import tempfile

HEALTH_PROTO = ('syntax = "proto3";\npackage grpc.health.v1;\n'
                "message HealthCheckRequest { string service = 1; }\n"
                "message HealthCheckResponse {\n"
                "  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }\n"
                "  ServingStatus status = 1;\n}\n"
                "service Health { rpc Check(HealthCheckRequest) returns (HealthCheckResponse); }\n")
HEALTH_MODULES = ("kvmesh_test_health_pb2", "kvmesh_test_health_pb2_grpc")


def load(protoc, proto_dir, proto_files, modules):
    """Generates `proto_files` (relative to `proto_dir`) and the health protocol; returns
    the imported `modules` followed by the health _pb2 and _pb2_grpc modules."""
    out = tempfile.mkdtemp(prefix="kvmesh-grpc-stubs-")
    with open(os.path.join(out, "kvmesh_test_health.proto"), "w") as f:
        f.write(HEALTH_PROTO)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for root, files in ((proto_dir, list(proto_files)), (out, ["kvmesh_test_health.proto"])):
        rc = protoc.main(["grpc_tools.protoc", f"-I{root}", f"-I{include}", f"--python_out={out}",
                          f"--grpc_python_out={out}", *files])
        assert rc == 0, f"protoc failed on {files}"
    sys.path.insert(0, out)
    return tuple(importlib.import_module(m) for m in (*modules, *HEALTH_MODULES))
