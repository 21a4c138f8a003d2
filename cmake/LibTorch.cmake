# LibTorch from the PyPI torch wheel in RECAL_PYTHON's environment (scripts/venv.sh makes it;
# scripts/python-requirements.txt pins it): the imported target recal_libtorch.
#
# Not the wheel's own TorchConfig.cmake: for a CUDA wheel it insists on a CUDA toolkit (and
# would link the toolkit's runtime, not the wheel's), yet the wheel carries every library it
# needs. So this finds the headers and libraries of the wheel itself, and the binaries run on
# CPU anywhere and on a GPU where a driver is present.
#
# Sets RECAL_TORCH_VERSION, RECAL_TORCH_CUDA (the wheel's CUDA version, empty for a CPU
# wheel) and RECAL_TORCH_LIB_DIR; the imported targets recal_libtorch (CPU) and
# recal_libtorch_cuda (the CUDA kernels besides, where the wheel has them).
execute_process(
  COMMAND ${RECAL_PYTHON} -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(torch.version.cuda or ''); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_VARIABLE torch_error RESULT_VARIABLE torch_result)
if(NOT torch_result EQUAL 0)
  message(FATAL_ERROR "RECAL_PYTHON=${RECAL_PYTHON} cannot import torch (${torch_error}): "
                      "run scripts/venv.sh, or pass -DRECAL_PYTHON=<a python with the torch wheel>")
endif()
string(REPLACE "\n" ";" torch_facts "${torch_facts}")
list(GET torch_facts 0 torch_dir)
list(GET torch_facts 1 RECAL_TORCH_VERSION)
list(GET torch_facts 2 RECAL_TORCH_CUDA)
list(GET torch_facts 3 torch_cxx11_abi)
set(RECAL_TORCH_LIB_DIR ${torch_dir}/lib)

# The wheel's include/ also holds headers of the third-party code it was built with, protobuf's
# among them (google/protobuf), which would be searched before the system's: torch 2.11 (the
# lent GPU machine's) carries protobuf 3.13, and the project's generated *.pb.h must compile
# against the protoc and library that made them. So the include path is a directory of links
# to every entry of the wheel's include/ except google/, for every torch the same way.
set(torch_include ${CMAKE_BINARY_DIR}/torch-include)
file(REMOVE_RECURSE ${torch_include})
file(MAKE_DIRECTORY ${torch_include})
file(GLOB torch_include_entries RELATIVE ${torch_dir}/include ${torch_dir}/include/*)
foreach(entry IN LISTS torch_include_entries)
  if(NOT entry STREQUAL "google")
    file(CREATE_LINK ${torch_dir}/include/${entry} ${torch_include}/${entry} SYMBOLIC)
  endif()
endforeach()
add_library(recal_libtorch INTERFACE IMPORTED GLOBAL)
target_include_directories(recal_libtorch SYSTEM INTERFACE
  ${torch_include} ${torch_include}/torch/csrc/api/include)
target_compile_definitions(recal_libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=${torch_cxx11_abi})
# LibTorch 2.x's headers are C++20: what includes them is built as C++20, the rest of the
# project stays C++17.
target_compile_features(recal_libtorch INTERFACE cxx_std_20)
# Not libtorch.so: in a CUDA wheel it is a shim that needs libtorch_cuda.so.
target_link_libraries(recal_libtorch INTERFACE ${RECAL_TORCH_LIB_DIR}/libtorch_cpu.so ${RECAL_TORCH_LIB_DIR}/libc10.so)
# recal_libtorch_cuda: the CUDA kernels, for the executables that run models on a device
# (recal-worker, recal-run) and nothing else. A CUDA wheel registers its kernels and hooks
# from libtorch_cuda.so's static initialisers: nothing of ours names a symbol in it, so
# --as-needed would drop it and at::hasCUDA() would say false on a machine with a GPU. Only
# there: cuBLASLt, which it loads, makes civetweb (the /metrics server) fail to start in the
# same process, and tests that link the engine need no GPU.
add_library(recal_libtorch_cuda INTERFACE IMPORTED GLOBAL)
target_link_libraries(recal_libtorch_cuda INTERFACE recal_libtorch)
if(EXISTS ${RECAL_TORCH_LIB_DIR}/libtorch_cuda.so)
  target_link_libraries(recal_libtorch_cuda INTERFACE -Wl,--no-as-needed ${RECAL_TORCH_LIB_DIR}/libtorch_cuda.so
                        ${RECAL_TORCH_LIB_DIR}/libc10_cuda.so -Wl,--as-needed)
endif()
# Found at run time from the build tree's RPATH; an installed binary (the image) is given
# RECAL_TORCH_LIB_DIR's place by its install RPATH (server/CMakeLists.txt).
message(STATUS "LibTorch ${RECAL_TORCH_VERSION} (CUDA ${RECAL_TORCH_CUDA}) from ${torch_dir}")
