#pragma once

namespace torch_fl::aten {

// Registers the boxed routing kernel directly for the structured operators
// whose native kernels can run them without decomposition (see fallback.cpp).
// Called once, after every static registration of the library has run.
void register_direct_routes();

}  // namespace torch_fl::aten
