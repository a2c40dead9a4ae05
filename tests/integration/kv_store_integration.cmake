# The kv-store integration test: the real kvmesh-kv-store on 127.0.0.1 driven by
# KvStoreClient (restarts, SIGSTOP, SIGKILL mid-get, two stores).
kvmesh_test(kv_store_integration_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kv_store_integration_test.cc
  DEPS kvmesh_kv_store_rpc
  LABELS integration)
target_compile_definitions(kv_store_integration_test PRIVATE
  KVMESH_KV_STORE_BIN="$<TARGET_FILE:kvmesh-kv-store>")
add_dependencies(kv_store_integration_test kvmesh-kv-store)
# The kv-store's UCX data plane (--data_plane=ucx) through the real store: shm and tcp.
kvmesh_test(kv_store_ucx_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/kv_store_ucx_test.cc
  DEPS kvmesh_kv_store_rpc kvmesh_kv_transport
  LABELS integration)
target_compile_definitions(kv_store_ucx_test PRIVATE KVMESH_KV_STORE_BIN="$<TARGET_FILE:kvmesh-kv-store>")
add_dependencies(kv_store_ucx_test kvmesh-kv-store)
