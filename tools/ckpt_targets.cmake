# tools/ckpt_targets.cmake — shardopt-ckpt: inspect, verify, export and reshard checkpoint directories (no MPI launch).
add_executable(shardopt-ckpt ${CMAKE_CURRENT_LIST_DIR}/shardopt_ckpt.cpp)
target_link_libraries(shardopt-ckpt PRIVATE shardopt::shardopt)
target_compile_options(shardopt-ckpt PRIVATE ${SHARDOPT_WARNINGS})
