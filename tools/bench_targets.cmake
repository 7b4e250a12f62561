# tools/bench_targets.cmake — the shardopt-bench executable (collective sweeps and the optimizer step against a memory roofline).
#
# Included from tools/CMakeLists.txt. Paths go through CMAKE_CURRENT_LIST_DIR so the file
# also works when included from elsewhere.
add_executable(shardopt-bench ${CMAKE_CURRENT_LIST_DIR}/shardopt_bench.cpp)
# OpenMP: the STREAM measurement runs the same number of threads per rank as the update.
target_link_libraries(shardopt-bench PRIVATE shardopt::shardopt fmt::fmt OpenMP::OpenMP_CXX)
# kernels/precision.hpp: bf16/f16 conversions for the synthetic 16-bit parameters and gradients
# (it includes numerics/half_float.hpp, found from the repository root).
target_include_directories(shardopt-bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../kernels ${CMAKE_CURRENT_LIST_DIR}/..)
target_compile_options(shardopt-bench PRIVATE ${SHARDOPT_WARNINGS})
