#pragma once

// flagos random number generators. A flagos generator owns a generator of the
// driver's native device (CPU's mt19937 on the host driver) and forwards its
// state to it, so that PyTorch's native kernels, which insist on their own
// generator type, draw from it directly: the ATen layer passes native() to
// them. Seeded flagos results therefore equal the native device's.

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace torch_fl::runtime {

struct FlagosGeneratorImpl final : public c10::GeneratorImpl {
  FlagosGeneratorImpl(c10::DeviceIndex device, at::Generator native);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  // Accepts exactly what get_state() returns (a CPU uint8 tensor of the
  // native generator's state size); anything else is a clear error.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  static c10::DeviceType device_type();
  const at::Generator& native() const { return native_; }

 private:
  FlagosGeneratorImpl* clone_impl() const override;
  // Refuses `what` (get_offset, set_offset) where the native generator has no offset.
  void check_has_offset(const char* what) const;
  at::Generator native_;
};

// The default generator of a device (created on first use) and new ones.
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

// The native generator a kernel should use for `gen` (a flagos generator, or
// undefined for the device's default).
at::Generator native_generator(const std::optional<at::Generator>& gen,
                               c10::DeviceIndex device);

}  // namespace torch_fl::runtime
