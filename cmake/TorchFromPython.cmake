# Locates the installed torch through the Python interpreter and defines two
# interface targets: torch_cpu_libs (ATen/c10) and torch_python_libs. Cheaper
# and more predictable than find_package(Torch), which probes CUDA even when
# only the CPU libraries are needed.

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import torch, os; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__); print(int(torch.distributed.is_available())); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "torch is not importable by ${Python_EXECUTABLE}; install torch first (pip install torch==2.13.0)")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 TORCH_DIR)
list(GET _torch_info 1 TORCH_CXX11_ABI)
list(GET _torch_info 2 TORCH_VERSION_STRING)
list(GET _torch_info 3 TORCH_DISTRIBUTED)
list(LENGTH _torch_info _n)
set(TORCH_CUDA_VERSION "")
if(_n GREATER 4)
  list(GET _torch_info 4 TORCH_CUDA_VERSION)
endif()
message(STATUS "torch ${TORCH_VERSION_STRING} at ${TORCH_DIR} (CUDA: ${TORCH_CUDA_VERSION}, distributed: ${TORCH_DISTRIBUTED})")

add_library(torch_cpu_libs INTERFACE)
target_include_directories(torch_cpu_libs SYSTEM INTERFACE
  ${TORCH_DIR}/include
  ${TORCH_DIR}/include/torch/csrc/api/include)
target_compile_definitions(torch_cpu_libs INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
target_link_directories(torch_cpu_libs INTERFACE ${TORCH_DIR}/lib)
target_link_libraries(torch_cpu_libs INTERFACE c10 torch_cpu torch)

add_library(torch_python_libs INTERFACE)
target_link_libraries(torch_python_libs INTERFACE torch_python)
target_compile_definitions(torch_python_libs INTERFACE TORCH_EXTENSION_NAME=_C)

# CUDA: torch's CUDA libraries for the cuda driver (see CMakeLists.txt).
add_library(torch_cuda_libs INTERFACE)
target_link_libraries(torch_cuda_libs INTERFACE c10_cuda torch_cuda)
