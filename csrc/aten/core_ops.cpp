// Device-core operators: the ones that create, reshape and re-point flagos
// tensors, and read a scalar back. They touch metadata and the allocator
// only, so they are the same on every driver and never go through routing.

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/Context.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/native_view.h"
#include "aten/own_kernels.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/flagos_tensor.h"
#include "runtime/storage.h"
#include "runtime/stream.h"

namespace torch_fl::aten {
namespace {

using runtime::kFlagos;

c10::DeviceIndex target_device(std::optional<c10::Device> device) {
  c10::DeviceIndex index =
      device.has_value() && device->has_index() ? device->index() : -1;
  return runtime::resolve_device(index);
}

void check_layout(std::optional<c10::Layout> layout) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided,
              "flagos supports only strided tensors, got layout ", *layout);
}

// torch.use_deterministic_algorithms(True) (with fill_uninitialized_memory, its
// default): new memory is filled with NaN or the integer maximum, as the CPU's
// and CUDA's empty and resize_ do.
bool fills_uninitialized_memory() {
  const auto& context = at::globalContext();
  return context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory();
}

// A flagos tensor over fresh memory (runtime/flagos_tensor.h), laid out in
// `memory_format` when no strides are given.
at::Tensor new_flagos_tensor(c10::IntArrayRef size, std::optional<c10::IntArrayRef> stride,
                             std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Device> device,
                             std::optional<c10::MemoryFormat> memory_format) {
  at::detail::check_size_nonnegative(size);
  at::Tensor t = runtime::empty_flagos(target_device(device), size, stride,
                                       c10::dtype_or_default(dtype));
  if (!stride && memory_format.has_value() && *memory_format != c10::MemoryFormat::Contiguous) {
    t.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  }
  if (C10_UNLIKELY(fills_uninitialized_memory())) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  check_layout(layout);
  TORCH_CHECK(!pin_memory.value_or(false),
              "only CPU tensors can be pinned, not flagos tensors");
  return new_flagos_tensor(size, std::nullopt, dtype, device, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_layout(layout);
  TORCH_CHECK(!pin_memory.value_or(false),
              "only CPU tensors can be pinned, not flagos tensors");
  TORCH_CHECK(size.size() == stride.size(), "empty_strided: ", size.size(),
              " sizes but ", stride.size(), " strides");
  return new_flagos_tensor(size, stride, dtype, device, std::nullopt);
}

void maybe_grow_storage(c10::TensorImpl* self, size_t needed_bytes) {
  if (needed_bytes == 0) return;
  auto& storage = self->unsafe_storage();
  TORCH_CHECK(storage, "cannot resize a flagos tensor without storage");
  if (needed_bytes > storage.nbytes()) {
    runtime::resize_storage_bytes(*storage.unsafeGetStorageImpl(), needed_bytes);
  }
}

void resize_impl(c10::TensorImpl* self, c10::IntArrayRef size,
                 std::optional<c10::IntArrayRef> stride) {
  if (self->sizes() == size && (!stride || self->strides() == *stride)) return;
  const auto itemsize = self->dtype().itemsize();
  const auto offset = self->storage_offset();
  size_t needed;
  if (stride) {
    self->set_sizes_and_strides(size, *stride);
    needed = at::detail::computeStorageNbytes(size, *stride, itemsize, offset);
  } else {
    self->set_sizes_contiguous(size);
    needed = at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  }
  maybe_grow_storage(self, needed);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (auto s : size) {
    TORCH_CHECK(s >= 0, "resize_: sizes must be non-negative, got ", size);
  }
  c10::DeviceGuard guard(self.device());
  const bool fill = fills_uninitialized_memory();
  const auto& storage = self.unsafeGetTensorImpl()->unsafe_storage();
  const int64_t old_nbytes = fill && storage ? static_cast<int64_t>(storage.nbytes()) : 0;
  resize_impl(self.unsafeGetTensorImpl(), size, std::nullopt);
  if (C10_UNLIKELY(fill)) at::native::fill_resize_deterministic_(self, old_nbytes);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "unsupported memory format ", *memory_format);
    self.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source,
                               int64_t storage_offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  // checkSetStorage refuses a storage of another device with the CPU's and CUDA's message.
  at::native::checkSetStorage(self, std::move(source), storage_offset, size,
                              stride);
  self.unsafeGetTensorImpl()->set_storage_offset(storage_offset);
  c10::DeviceGuard guard(self.device());
  std::optional<c10::IntArrayRef> st =
      stride.data() != nullptr ? std::optional<c10::IntArrayRef>(stride)
                               : std::nullopt;
  resize_impl(self.unsafeGetTensorImpl(), size, st);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  int64_t elements =
      static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {elements}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(),
                            source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(runtime::allocate_flagos_storage(self.device().index(), 0));
  return set_storage_offset(self, std::move(empty), 0, {0}, {});
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  // The native device's item() knows how to wait for the current stream.
  NativeViews views;
  return views.to_native(self).item();
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  runtime::device_allocator().recordStream(self.storage().data_ptr(), stream);
}

// Whether `from` may replace `self`'s data in place (param.data = from).
// c10 only knows its own dense backends as mutually compatible, so without
// this nn.Module.to("flagos") makes a new Parameter per module and unties
// shared weights (a language model's embedding and output layer).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    auto type = t.device().type();
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
           (type == kFlagos || type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense(self) && dense(from));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  impl_own(m, "_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  impl_own(m, "empty.memory_format", TORCH_FN(empty_memory_format));
  impl_own(m, "empty_strided", TORCH_FN(empty_strided));
  impl_own(m, "as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  impl_own(m, "view", TORCH_FN(at::native::view));
  impl_own(m, "_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  impl_own(m, "resize_", TORCH_FN(resize_));
  impl_own(m, "set_.source_Storage", TORCH_FN(set_storage));
  impl_own(m, "set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  impl_own(m, "set_.source_Tensor", TORCH_FN(set_tensor));
  impl_own(m, "set_", TORCH_FN(set_empty));
  impl_own(m, "_local_scalar_dense", TORCH_FN(local_scalar_dense));
  impl_own(m, "record_stream", TORCH_FN(record_stream));
}

}  // namespace torch_fl::aten
