# Profile-guided optimisation of libtorch_fl (GCC). The routing path costs
# flagos a few hundred nanoseconds an operator, and most of that is the
# number of cache lines it touches, not its instruction count
# (docs/benchmarks.md). A profile lets GCC lay out hot blocks together and
# move cold ones (error paths, rare branches) out of the way.
#
#   FLAGOS_PGO=generate  instrument; running a workload writes the profile to FLAGOS_PGO_DIR
#   FLAGOS_PGO=use       build with that profile
#   FLAGOS_PGO=          (default) neither
#
# The profile names each object by its path, so "use" must build in the same
# build tree as "generate". scripts/pgo_build.sh runs the three steps.
set(FLAGOS_PGO "" CACHE STRING "Profile-guided optimisation of libtorch_fl: generate, use, or empty (off)")
set(FLAGOS_PGO_DIR "${CMAKE_BINARY_DIR}/pgo-profile" CACHE PATH "Where FLAGOS_PGO=generate writes the profile and =use reads it")
set_property(CACHE FLAGOS_PGO PROPERTY STRINGS "" generate use)

set(_pgo_compile "")
set(_pgo_link "")
if(FLAGOS_PGO STREQUAL "")
elseif(NOT FLAGOS_PGO MATCHES "^(generate|use)$")
  message(FATAL_ERROR "FLAGOS_PGO='${FLAGOS_PGO}': valid values are generate, use, or empty (off)")
elseif(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  message(FATAL_ERROR "FLAGOS_PGO=${FLAGOS_PGO} needs GCC; this build uses ${CMAKE_CXX_COMPILER_ID}. "
                      "Set CXX to a g++, or leave FLAGOS_PGO empty (scripts/bootstrap.sh: FLAGOS_PGO=0).")
elseif(CMAKE_CXX_COMPILER_VERSION VERSION_LESS 10)
  message(FATAL_ERROR "FLAGOS_PGO=${FLAGOS_PGO} needs GCC 10 or later (-fprofile-partial-training); "
                      "this is GCC ${CMAKE_CXX_COMPILER_VERSION}")
elseif(FLAGOS_SANITIZE)
  message(FATAL_ERROR "FLAGOS_PGO=${FLAGOS_PGO} and FLAGOS_SANITIZE=ON: choose one")
elseif(FLAGOS_PGO STREQUAL "generate")
  # prefer-atomic: the workload's threads (autograd's, DataLoader's) count into shared counters.
  set(_pgo_compile -fprofile-generate=${FLAGOS_PGO_DIR} -fprofile-update=prefer-atomic)
  set(_pgo_link -fprofile-generate=${FLAGOS_PGO_DIR})
  message(STATUS "torch_fl: PGO instrumented build; a run writes its profile to ${FLAGOS_PGO_DIR}")
else()
  # GCC names each object's profile after the object's path, '/' written '#': a profile made in
  # another build tree would match no object here, and each would be built without one.
  string(REPLACE "/" "#" _pgo_tree "${CMAKE_BINARY_DIR}")
  file(GLOB _pgo_profiles "${FLAGOS_PGO_DIR}/${_pgo_tree}#*.gcda")
  if(NOT _pgo_profiles)
    message(FATAL_ERROR "FLAGOS_PGO=use but ${FLAGOS_PGO_DIR} holds no profile of this build tree "
                        "(${CMAKE_BINARY_DIR}): build with FLAGOS_PGO=generate in this build tree and run a "
                        "workload first (scripts/pgo_build.sh)")
  endif()
  # partial-training: code the workload never ran (other drivers, error paths) keeps the
  # ordinary treatment instead of being optimised for size.
  # coverage-mismatch: a profile older than an edited source is ignored for the functions
  # that changed, with a warning, rather than failing the build. GCC's missing-profile
  # warning stays on: every object of an instrumented library gets a profile when it loads.
  set(_pgo_compile -fprofile-use=${FLAGOS_PGO_DIR} -fprofile-partial-training
      -Wno-error=coverage-mismatch)
  message(STATUS "torch_fl: PGO build with the profile in ${FLAGOS_PGO_DIR}")
endif()

# Applies the options of FLAGOS_PGO to each target given.
function(flagos_apply_pgo)
  foreach(_target ${ARGN})
    target_compile_options(${_target} PRIVATE ${_pgo_compile})
    # PUBLIC: whatever links an instrumented static library needs the profiling runtime too.
    target_link_options(${_target} PUBLIC ${_pgo_link})
  endforeach()
endfunction()
