# One precompiled header of LibTorch's API for every target that compiles against it.
#
# Parsing <ATen/ATen.h> or <torch/script.h> takes ~10 s of every translation unit that
# includes them (most of a cold build's time on two cores); read from one precompiled header
# it takes well under a second. The header is built once (recal_torch_pch) and reused by each
# target whose link closure holds recal_libtorch, found here so that no CMakeLists.txt has to
# remember it. GCC falls back to the text headers, silently and correctly, wherever the
# precompiled one does not fit a target's flags (-Winvalid-pch warns where).
#
# Not for the sanitizer and fuzz builds: their instrumentation flags would need a header of
# their own, and they are built rarely.

# True in `out` when `target`'s link closure (through INTERFACE_LINK_LIBRARIES) holds recal_libtorch.
function(recal_links_torch target out)
  set(pending ${target})
  set(seen "")
  while(pending)
    list(POP_FRONT pending current)
    if(current IN_LIST seen OR NOT TARGET ${current})
      continue()
    endif()
    list(APPEND seen ${current})
    if(current STREQUAL "recal_libtorch")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    get_target_property(imported ${current} IMPORTED)
    get_target_property(type ${current} TYPE)
    set(links "")
    if(NOT imported AND NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(links ${current} LINK_LIBRARIES)
    endif()
    get_target_property(interface_links ${current} INTERFACE_LINK_LIBRARIES)
    foreach(link IN LISTS links interface_links)
      # $<LINK_ONLY:x> and other generator expressions name no target to follow here.
      if(link AND NOT link MATCHES "^\\$<" AND TARGET ${link})
        list(APPEND pending ${link})
      endif()
    endforeach()
  endwhile()
  set(${out} FALSE PARENT_SCOPE)
endfunction()

function(recal_targets_in directory out)
  get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirectories DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    recal_targets_in(${subdirectory} nested)
    list(APPEND targets ${nested})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The header's owner for `kind` (EXECUTABLE or a library): GCC takes a precompiled header only
# under the flags it was made with, and CMake compiles executables with -fPIE, libraries with
# -fPIC, so each kind has its own.
function(recal_torch_pch_owner kind out)
  set(source ${PROJECT_BINARY_DIR}/recal_torch_pch.cc)
  file(CONFIGURE OUTPUT ${source} CONTENT "// Builds LibTorch's precompiled header.\nint main() { return 0; }\n")
  if(kind STREQUAL "EXECUTABLE")
    set(owner recal_torch_pch_executables)
    if(NOT TARGET ${owner})
      add_executable(${owner} EXCLUDE_FROM_ALL ${source})
    endif()
  else()
    set(owner recal_torch_pch_libraries)
    if(NOT TARGET ${owner})
      add_library(${owner} OBJECT EXCLUDE_FROM_ALL ${source})
    endif()
  endif()
  target_link_libraries(${owner} PRIVATE recal_libtorch)
  # -pthread defines _REENTRANT, which GCC compares: targets that link Threads::Threads have
  # it and the others would not, so every user of the header is given it (a no-op on glibc).
  target_compile_options(${owner} PRIVATE -pthread)
  target_precompile_headers(${owner} PRIVATE <ATen/ATen.h> <torch/script.h>)
  set(${out} ${owner} PARENT_SCOPE)
endfunction()

# Called at the end of the top-level CMakeLists.txt, once every target exists.
function(recal_use_torch_precompiled_header)
  if(RECAL_SANITIZE OR RECAL_FUZZ OR NOT RECAL_TORCH_PCH)
    return()
  endif()
  recal_targets_in(${PROJECT_SOURCE_DIR} targets)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|STATIC_LIBRARY|OBJECT_LIBRARY|MODULE_LIBRARY)$")
      continue()
    endif()
    recal_links_torch(${target} links_torch)
    if(links_torch)
      recal_torch_pch_owner(${type} owner)
      target_precompile_headers(${target} REUSE_FROM ${owner})
      target_compile_options(${target} PRIVATE -Winvalid-pch -pthread)
    endif()
  endforeach()
endfunction()
