#pragma once

#include <pybind11/pybind11.h>

namespace torch_fl::python {

// Adds torch_fl._C._distributed: the ProcessGroupFlagos backend class that
// torch_fl/distributed.py registers with torch.distributed. Without
// torch.distributed in the torch build, the submodule is empty.
void init_distributed(pybind11::module& m);

}  // namespace torch_fl::python
