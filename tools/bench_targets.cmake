# tools/bench_targets.cmake — the shardopt-bench executable (collective sweeps and the optimizer step against a memory roofline).
#
# Included from tools/CMakeLists.txt. Paths go through CMAKE_CURRENT_LIST_DIR so the file
# also works when included from elsewhere.
# main in shardopt_bench.cpp; one job per file under bench/ (see the top of shardopt_bench.cpp).
# Every source gets the flags below: OpenMP (the STREAM kernels, the synthetic fills), the
# kernels' include directories (bench_model.cpp and stream_roofline.cpp use precision.hpp).
add_executable(shardopt-bench
  ${CMAKE_CURRENT_LIST_DIR}/shardopt_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench/options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench/collectives_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench/bench_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench/stream_roofline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bench/step_bench.cpp
  # The bandwidth probes, compiled and dispatched exactly as the update kernels (their own copy:
  # the library exports only its API).
  $<TARGET_OBJECTS:shardopt_kernels_cpu>)
# OpenMP: the STREAM measurement runs the same number of threads per rank as the update.
target_link_libraries(shardopt-bench PRIVATE shardopt::shardopt fmt::fmt OpenMP::OpenMP_CXX)
target_include_directories(shardopt-bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../include)
# kernels/precision.hpp: bf16/f16 conversions for the synthetic 16-bit parameters and gradients
# (it includes numerics/half_float.hpp, found from the repository root).
target_include_directories(shardopt-bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../kernels ${CMAKE_CURRENT_LIST_DIR}/..)
target_compile_options(shardopt-bench PRIVATE ${SHARDOPT_WARNINGS})
