// Bindings of csrc/ipc (flagos memory shared with other processes);
// torch_fl/flagos/_sharing.py is their Python face.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "ipc/host_segments.h"
#include "ipc/native_memory.h"

namespace py = pybind11;

namespace torch_fl::python {

void init_ipc(py::module_& m) {
  m.def("_ipc_native_bytes_to_send", [](const at::Tensor& t) {
    HANDLE_TH_ERRORS
    return ipc::native_bytes_to_send(t);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_ipc_flagos_bytes_received", [](const at::Tensor& native, int device) {
    HANDLE_TH_ERRORS
    return ipc::flagos_bytes_received(native, static_cast<c10::DeviceIndex>(device));
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
    // The copy can take seconds for a large storage: other Python threads run
    // meanwhile (the caller holds its own lock against a second move).
    py::gil_scoped_release no_gil;
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
