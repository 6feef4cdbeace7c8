#include "python/distributed.h"

#ifdef FLAGOS_WITH_DISTRIBUTED
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "distributed/process_group.h"
#endif

namespace py = pybind11;

namespace torch_fl::python {

#ifdef FLAGOS_WITH_DISTRIBUTED
namespace {

// Binds ProcessGroupFlagos into `d`. Its base, c10d::Backend, gets its Python
// type when torch.distributed initialises c10d (torch._C._c10d_init), so this
// runs on first use from torch_fl/distributed.py, after that import.
py::object bind_process_group(py::module& d) {
  if (py::hasattr(d, "ProcessGroupFlagos")) return d.attr("ProcessGroupFlagos");
  using distributed::ProcessGroupFlagos;
  py::class_<ProcessGroupFlagos, c10d::Backend, c10::intrusive_ptr<ProcessGroupFlagos>>(
      d, "ProcessGroupFlagos",
      "c10d backend for flagos tensors: runs `inner` (gloo or NCCL) on zero-copy native "
      "views of them")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& inner, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupFlagos>(inner, rank, size, timeout);
           }),
           py::arg("inner"), py::arg("rank"), py::arg("size"), py::arg("timeout"))
      .def_property_readonly("inner", &ProcessGroupFlagos::inner,
                             "the backend that runs the collectives on native views");
  return d.attr("ProcessGroupFlagos");
}

}  // namespace
#endif

void init_distributed(py::module& m) {
  auto d = m.def_submodule("_distributed", "the flagos c10d backend");
#ifdef FLAGOS_WITH_DISTRIBUTED
  d.attr("available") = true;
  d.attr("BACKEND_NAME") = distributed::ProcessGroupFlagos::kName;
  d.def("_bind", [d]() mutable { return bind_process_group(d); },
        "binds and returns the ProcessGroupFlagos class (needs torch.distributed imported)");
#else
  d.attr("available") = false;
#endif
}

}  // namespace torch_fl::python
