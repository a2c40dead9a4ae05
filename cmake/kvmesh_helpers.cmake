# Warnings every kvmesh target compiles with.
add_library(kvmesh_warnings INTERFACE)
target_compile_options(kvmesh_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${KVMESH_WERROR}>>:-Werror>)

# kvmesh_library(NAME SOURCES ... DEPS ...): a static library rooted at libs/.
function(kvmesh_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/libs)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE kvmesh_warnings)
endfunction()

# kvmesh_test(NAME SOURCES ... DEPS ...): a GoogleTest binary registered with ctest.
function(kvmesh_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main kvmesh_warnings)
  target_compile_definitions(${name} PRIVATE
    KVMESH_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    KVMESH_BINARY_DIR="${PROJECT_BINARY_DIR}"
    KVMESH_TINY_MODEL_DIR="${KVMESH_TINY_MODEL_DIR}")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}")
endfunction()
