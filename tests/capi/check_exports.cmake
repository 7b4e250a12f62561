# tests/capi/check_exports.cmake — fails unless libshardopt's dynamic symbols are the C ABI and the public shardopt:: C++ API only (cmake -P, -DLIBRARY= -DNM=).
execute_process(COMMAND ${NM} -D --defined-only -C ${LIBRARY}
                RESULT_VARIABLE rc OUTPUT_VARIABLE listing ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed: ${err}")
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")

# The public C++ API's namespaces are shardopt:: itself; these are internals.
set(internal "shardopt::(partition|optim|checkpoint|kernels|capi|comm|core|detail|cuda|nccl_detail)::|anonymous namespace")
set(cxx_prefix "^(typeinfo for |typeinfo name for |vtable for |VTT for |non-virtual thunk to |virtual thunk to )?")
set(bad "")
set(count 0)
foreach(line IN LISTS lines)
  # "<address> <type> <name>"; the name may contain spaces.
  if(NOT line MATCHES "^[0-9a-fA-F]+ [A-Za-z] (.+)$")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  math(EXPR count "${count} + 1")
  if(name MATCHES "^shardopt_[a-z0-9_]+$")
    continue()
  endif()
  if(name MATCHES "${cxx_prefix}shardopt::" AND NOT name MATCHES "${internal}")
    continue()
  endif()
  string(APPEND bad "  ${name}\n")
endforeach()
if(bad)
  message(FATAL_ERROR "libshardopt exports symbols outside the C ABI and the public C++ API "
                      "(fmt::, std::, MPI helpers or internals must stay hidden):\n${bad}")
endif()

# And what users need is there.
foreach(required
    "shardopt_optimizer_create" "shardopt_last_error" "shardopt_tensor_from_dlpack" "shardopt_version"
    "shardopt_optimizer_reduce_gradient" "shardopt_optimizer_reduce_gradient_dlpack"
    "shardopt_optimizer_param_view_dlpack" "shardopt_optimizer_grad_view_dlpack"
    "shardopt_optimizer_clip_grad_norm" "shardopt_optimizer_loss_scale" "shardopt_optimizer_set_loss_scale"
    "shardopt_optimizer_last_step" "shardopt_default_hyperparams" "shardopt_optimizer_get_defaults"
    "shardopt_optimizer_step_without" "shardopt_optimizer_join_step"
    "shardopt_model_averager_create" "shardopt_model_averager_average_parameters"
    "shardopt_post_local_sgd_create" "shardopt_post_local_sgd_step" "shardopt_post_local_sgd_state_dict_step"
    "shardopt::PostLocalSGDOptimizer::step()" "shardopt::ModelAverager::average_parameters()"
    "shardopt::mpi_world(" "shardopt::ZeroOptimizer::step()" "typeinfo for shardopt::Error"
    "typeinfo for shardopt::CommBackend" "shardopt::Communicator::Communicator(" "shardopt::backend_of("
    "shardopt::error_code_name(" "shardopt::cpu_kernel_isa(")
  string(FIND "${listing}" "${required}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "libshardopt does not export ${required}")
  endif()
endforeach()
message("libshardopt exports ${count} symbols, all shardopt_* or public shardopt::")
