# tests/install/run_install_test.cmake — one step of the install test (cmake -P): install into a prefix, or build and run a consumer against it.
#
# -DSTEP=prefix: `cmake --install` BUILD_DIR into PREFIX, then checks the installed layout.
# -DSTEP=find_package_c|find_package_cpp: configures and builds consumer_c|consumer_cpp with
#   CMAKE_PREFIX_PATH=PREFIX only (no MPI found, none needed), runs it under mpiexec -n 2.
# -DSTEP=pkg_config_c|pkg_config_cpp: the same consumer compiled by hand with the flags from
#   `pkg-config --cflags --libs shardopt`, run the same way.
# The README's quick starts: run_markdown_example.cmake.
cmake_minimum_required(VERSION 3.16)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("$ ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (exit ${rc}): ${ARGN}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()

# Runs `program` on two ranks; each must print `expected`.
function(run_two_ranks program expected)
  separate_arguments(flags UNIX_COMMAND "${MPIEXEC_FLAGS}")
  run(${MPIEXEC} -n 2 ${flags} ${program})
  foreach(rank 0 1)
    if(NOT run_output MATCHES "rank ${rank}: [^\n]*${expected}")
      message(FATAL_ERROR "rank ${rank} did not report '${expected}'")
    endif()
  endforeach()
endfunction()

if(STEP STREQUAL "prefix")
  file(REMOVE_RECURSE ${PREFIX})
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
  foreach(file
      include/shardopt/shardopt.h include/shardopt/shardopt.hpp include/shardopt/export.hpp
      include/shardopt/dlpack.h include/shardopt/dlpack/dlpack.h
      ${LIBDIR}/libshardopt.so ${LIBDIR}/cmake/shardopt/shardoptConfig.cmake
      ${LIBDIR}/cmake/shardopt/shardoptConfigVersion.cmake ${LIBDIR}/cmake/shardopt/shardoptTargets.cmake
      ${LIBDIR}/pkgconfig/shardopt.pc share/doc/shardopt/third_party/dlpack/LICENSE)
    if(NOT EXISTS ${PREFIX}/${file})
      message(FATAL_ERROR "not installed: ${PREFIX}/${file}")
    endif()
  endforeach()
  # Internal headers stay out of the install.
  file(GLOB_RECURSE installed_headers RELATIVE ${PREFIX}/include ${PREFIX}/include/*)
  foreach(header ${installed_headers})
    if(NOT header MATCHES "^shardopt/")
      message(FATAL_ERROR "unexpected file in include/: ${header}")
    endif()
  endforeach()
  # MPI is private to the shared library: the exported target must not ask its users for it.
  file(READ ${PREFIX}/${LIBDIR}/cmake/shardopt/shardoptTargets.cmake targets)
  if(targets MATCHES "MPI::|OpenMP::|fmt::")
    message(FATAL_ERROR "shardoptTargets.cmake exposes a private dependency")
  endif()
  return()
endif()

if(STEP MATCHES "^(find_package|pkg_config)_(c|cpp)$")
  set(kind ${CMAKE_MATCH_1})
  set(language ${CMAKE_MATCH_2})
else()
  message(FATAL_ERROR "unknown STEP '${STEP}'")
endif()
if(language STREQUAL "c")
  set(source ${SOURCE_DIR}/consumer_c/adamw_consumer.c)
  set(program_name adamw_consumer)
  set(expected "sharded AdamW steps over 2 ranks match the reference")
else()
  set(source ${SOURCE_DIR}/consumer_cpp/sgd_consumer.cpp)
  set(program_name sgd_consumer)
  set(expected "SGD momentum steps match")
endif()
set(build ${WORK_DIR}/${STEP})
file(REMOVE_RECURSE ${build})
file(MAKE_DIRECTORY ${build})

if(kind STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/consumer_${language} -B ${build}
      -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS=${SANITIZE_FLAGS}" "-DCMAKE_CXX_FLAGS=${SANITIZE_FLAGS}"
      "-DCMAKE_EXE_LINKER_FLAGS=${SANITIZE_FLAGS}")
  run(${CMAKE_COMMAND} --build ${build})
else()
  set(ENV{PKG_CONFIG_PATH} ${PREFIX}/${LIBDIR}/pkgconfig)
  run(${PKG_CONFIG} --cflags shardopt)
  separate_arguments(cflags UNIX_COMMAND "${run_output}")
  run(${PKG_CONFIG} --libs shardopt)
  separate_arguments(libs UNIX_COMMAND "${run_output}")
  run(${PKG_CONFIG} --variable=libdir shardopt)
  string(STRIP "${run_output}" libdir)
  separate_arguments(sanitize UNIX_COMMAND "${SANITIZE_FLAGS}")
  if(language STREQUAL "c")
    run(${C_COMPILER} -std=c99 -Wall -Wextra -Werror -pedantic ${sanitize} ${cflags} ${source} ${libs} -lm
        -Wl,-rpath,${libdir} -o ${build}/${program_name})
  else()
    run(${CXX_COMPILER} -std=c++17 -Wall -Wextra -Werror ${sanitize} ${cflags} ${source} ${libs}
        -Wl,-rpath,${libdir} -o ${build}/${program_name})
  endif()
endif()
run_two_ranks(${build}/${program_name} "${expected}")
