#pragma once

#include <pybind11/pybind11.h>

namespace torch_fl::python {

// Binds the C++ launch path of FlagGems kernels (csrc/flaggems): installing
// it, its Python side (torch_fl/_flaggems_cpp.py), statistics, switches and
// the offline plan checks.
void init_flaggems(pybind11::module& m);

}  // namespace torch_fl::python
