#pragma once

// A flagos tensor over fresh memory, made without a dispatch: a FlagosStorage
// from the flagos allocator (so its native twin exists from the start) and a
// TensorImpl of the given geometry. torch_fl's empty and empty_strided and the
// FlagGems launcher's outputs are made here. Inline: every routed call's
// results are allocated through it.

#include <optional>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include "runtime/storage.h"

namespace torch_fl::runtime {

inline at::Tensor empty_flagos(c10::DeviceIndex device, c10::IntArrayRef sizes,
                               std::optional<c10::IntArrayRef> strides,
                               c10::ScalarType dtype) {
  const auto meta = c10::scalarTypeToTypeMeta(dtype);
  const size_t nbytes =
      strides ? at::detail::computeStorageNbytes(sizes, *strides, meta.itemsize())
              : at::detail::computeStorageNbytesContiguous(sizes, meta.itemsize());
  auto tensor = at::detail::make_tensor_base<c10::TensorImpl>(
      c10::Storage(allocate_flagos_storage(device, nbytes)),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), meta);
  auto* impl = tensor.unsafeGetTensorImpl();
  if (strides) {
    impl->set_sizes_and_strides(sizes, *strides);
  } else if (sizes.size() != 1 || sizes[0] != 0) {
    impl->set_sizes_contiguous(sizes);  // a fresh TensorImpl is the 1-d empty tensor already
  }
  return at::Tensor(std::move(tensor));
}

}  // namespace torch_fl::runtime
