# The scheduler's mirror of the kv-store (StoreResidencyPoller) over the real
# kvmesh-kv-store on 127.0.0.1: puts become placement hits; restarts (a new epoch),
# kills and evictions reach it.
kvmesh_test(store_residency_integration_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/store_residency_integration_test.cc
  DEPS kvmesh_scheduler_service kvmesh_kv_store_rpc
  LABELS integration)
target_compile_definitions(store_residency_integration_test PRIVATE
  KVMESH_KV_STORE_BIN="$<TARGET_FILE:kvmesh-kv-store>")
add_dependencies(store_residency_integration_test kvmesh-kv-store)
