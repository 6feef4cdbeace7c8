// Bindings of csrc/ipc (flagos memory shared with other processes);
// torch_fl/flagos/_sharing.py is their Python face.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "ipc/shared_memory.h"

namespace py = pybind11;

namespace torch_fl::python {

void init_ipc(py::module_& m) {
  m.def("_ipc_native_bytes", [](const at::Tensor& t) {
    HANDLE_TH_ERRORS
    return ipc::native_bytes(t);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_ipc_flagos_bytes", [](const at::Tensor& native, int device, bool received) {
    HANDLE_TH_ERRORS
    return ipc::flagos_bytes(native, static_cast<c10::DeviceIndex>(device), received);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_ipc_host_segment", [](const at::Tensor& t) {
    HANDLE_TH_ERRORS
    return ipc::host_segment(t);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_ipc_host_move_into", [](const at::Tensor& t, const at::Tensor& segment,
                                  std::string strategy) {
    HANDLE_TH_ERRORS
    ipc::host_move_into(t, segment, std::move(strategy));
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_ipc_host_adopt", [](const at::Tensor& segment, int device, std::string strategy) {
    HANDLE_TH_ERRORS
    return ipc::host_adopt(segment, static_cast<c10::DeviceIndex>(device), std::move(strategy));
    END_HANDLE_TH_ERRORS_PYBIND
  });
}

}  // namespace torch_fl::python
