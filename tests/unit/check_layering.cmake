# tests/unit/check_layering.cmake — fails when kernels/ or numerics/ include a header from outside their allowed set (src/ above all).
#
# Run as `cmake -DROOT=<repository root> -P check_layering.cmake`. The kernels' targets do not
# have src/ on their include path, but they do have the repository root (for numerics/), so
# `#include "src/..."` or a `../` path would still compile: this check closes that gap.
# kernels/ may include kernels/ headers, numerics/ headers and the public shardopt/ headers;
# numerics/ (a leaf) only numerics/ headers. System headers (<...>) are not checked.
if(NOT ROOT)
  message(FATAL_ERROR "check_layering.cmake: pass -DROOT=<repository root>")
endif()

set(_violations "")
foreach(area kernels numerics)
  file(GLOB_RECURSE _files "${ROOT}/${area}/*.hpp" "${ROOT}/${area}/*.cpp" "${ROOT}/${area}/*.cu"
       "${ROOT}/${area}/*.cuh")
  foreach(_file ${_files})
    file(STRINGS "${_file}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    get_filename_component(_dir "${_file}" DIRECTORY)
    file(RELATIVE_PATH _name "${ROOT}" "${_file}")
    foreach(_line ${_lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*" "\\1" _header "${_line}")
      set(_ok FALSE)
      if(_header MATCHES "\\.\\.")
        set(_ok FALSE)  # no climbing out of the folder, whatever exists there
      elseif(_header MATCHES "^numerics/" AND EXISTS "${ROOT}/${_header}")
        set(_ok TRUE)
      elseif(area STREQUAL "kernels")
        if(_header MATCHES "^shardopt/" AND EXISTS "${ROOT}/include/${_header}")
          set(_ok TRUE)
        elseif(EXISTS "${ROOT}/kernels/${_header}" OR EXISTS "${_dir}/${_header}")
          set(_ok TRUE)
        endif()
      endif()
      if(NOT _ok)
        string(APPEND _violations "  ${_name}: #include \"${_header}\"\n")
      endif()
    endforeach()
  endforeach()
endforeach()

if(_violations)
  message(FATAL_ERROR "kernels/ and numerics/ include only kernels/, numerics/ and public shardopt/ "
                      "headers (numerics/: only numerics/); these do not:\n${_violations}")
endif()
message(STATUS "layering: kernels/ and numerics/ include nothing from src/")
