# Installs the client library into a fresh prefix, then configures, builds and runs
# client/example_consumer against it: what another project does with find_package.
# -D BUILD_DIR=<this build tree> -D SOURCE_DIR=<client/example_consumer> -D WORK_DIR=<scratch>
#    -D LAUNCHER=<compiler launcher or empty> -D SANITIZE=<RECAL_SANITIZE or empty>
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --component recal_client)
foreach(installed include/recal/client.h include/recal/data.h include/recal/v1/recal.pb.h
                  lib/cmake/recal_client/recal_clientConfig.cmake)
  if(NOT EXISTS ${prefix}/${installed})
    message(FATAL_ERROR "not installed: ${installed}")
  endif()
endforeach()
# A sanitizer build's library needs the sanitizer's runtime in the program that links it.
set(sanitize_flags "")
if(SANITIZE)
  set(sanitize_flags "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER} ${sanitize_flags})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/recal_example)
if(NOT last_output MATCHES "data source: safetensors:calib/images.safetensors:pixels")
  message(FATAL_ERROR "unexpected output: ${last_output}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "example consumer built and ran against ${prefix}")
