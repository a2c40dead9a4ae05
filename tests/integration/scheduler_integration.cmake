# The scheduler integration test: the real kvmesh-scheduler on 127.0.0.1 driven by gRPC
# C++ clients (and, when grpcio + grpcio-tools are installed, a Python client).
# Included from tests/unit/cluster/CMakeLists.txt for now.
# TODO(integrator): move the include into tests/integration/CMakeLists.txt.
kvmesh_test(scheduler_integration_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/scheduler_integration_test.cc
  DEPS kvmesh_rpc kvmesh_kv kvmesh_proto
  LABELS integration)
target_compile_definitions(scheduler_integration_test PRIVATE
  KVMESH_SCHEDULER_BIN="$<TARGET_FILE:kvmesh-scheduler>")
add_dependencies(scheduler_integration_test kvmesh-scheduler)
