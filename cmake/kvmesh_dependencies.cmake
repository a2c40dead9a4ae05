# Third-party libraries, all from Debian 12 packages (tools/setup installs them).
# docs/development.md, "Dependencies", says why some lines look the way they do.
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)  # CMake's module: Debian ships no protobuf config
find_package(gRPC CONFIG REQUIRED)
find_package(nlohmann_json 3.11 CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(dnnl CONFIG REQUIRED)
find_package(Gloo CONFIG REQUIRED)  # target is plain `gloo` (libs/comm)
find_package(prometheus-cpp CONFIG REQUIRED)  # core only (libs/metrics); /metrics is served by libs/http
find_package(OpenMP REQUIRED)
find_package(Python3 COMPONENTS Interpreter REQUIRED)
if(KVMESH_BUILD_TESTS)
  find_package(GTest REQUIRED)
  find_package(benchmark CONFIG REQUIRED)
endif()
