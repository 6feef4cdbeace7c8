#include "runtime/generator.h"

#include <array>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include "runtime/cuda_bridge.h"
#include "runtime/device.h"

namespace torch_fl::runtime {
namespace {

constexpr int kMaxDevices = 64;

at::Generator make_native(c10::DeviceIndex device) {
  if (uses_cuda()) return cuda::new_generator(device);
  return at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val);
}

// The default flagos generator of a cuda device wraps CUDA's default
// generator itself: torch.flagos.manual_seed and torch.cuda.manual_seed then
// seed the same stream of numbers, and seeded results match CUDA's exactly.
at::Generator make_default_native(c10::DeviceIndex device) {
  if (uses_cuda()) return cuda::default_generator(device);
  return make_native(device);
}

}  // namespace

FlagosGeneratorImpl::FlagosGeneratorImpl(c10::DeviceIndex device,
                                         at::Generator native)
    : c10::GeneratorImpl(c10::Device(kFlagos, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      native_(std::move(native)) {}

void FlagosGeneratorImpl::set_current_seed(uint64_t seed) {
  native_.set_current_seed(seed);
}

// CUDA's Philox generator has an offset; the host driver's generator is the
// CPU's Mersenne Twister, whose whole state is get_state()'s, and which
// would refuse with a message about a "CPU Generator".
void FlagosGeneratorImpl::check_has_offset(const char* what) const {
  TORCH_CHECK(!native_.device().is_cpu(), "the flagos generator does not support ", what,
              " on the host driver: it draws from the CPU's generator (a Mersenne Twister), "
              "which has no offset. Save and restore it with get_state() and set_state().");
}

void FlagosGeneratorImpl::set_offset(uint64_t offset) {
  check_has_offset("set_offset");
  native_.set_offset(offset);
}

uint64_t FlagosGeneratorImpl::get_offset() const {
  check_has_offset("get_offset");
  return native_.get_offset();
}

uint64_t FlagosGeneratorImpl::current_seed() const {
  return native_.current_seed();
}

uint64_t FlagosGeneratorImpl::seed() { return native_.seed(); }

void FlagosGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  auto expected = native_.get_state();
  TORCH_CHECK_TYPE(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                   "flagos RNG state must be a torch.uint8 tensor (as returned "
                   "by torch.flagos.get_rng_state()), got dtype ",
                   c10::typeMetaToScalarType(new_state.dtype()));
  TORCH_CHECK(new_state.device().is_cpu(),
              "flagos RNG state must be a CPU tensor (as returned by "
              "torch.flagos.get_rng_state()), got one on ",
              new_state.device());
  TORCH_CHECK_VALUE(new_state.numel() == expected.numel(),
                    "flagos RNG state has ", new_state.numel(),
                    " bytes but this device's generator state is ",
                    expected.numel(),
                    " bytes: pass a state from torch.flagos.get_rng_state()");
  native_.set_state(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::
                                   unsafe_reclaim_from_nonowning(
                                       const_cast<c10::TensorImpl*>(&new_state))));
}

c10::intrusive_ptr<c10::TensorImpl> FlagosGeneratorImpl::get_state() const {
  return native_.get_state().getIntrusivePtr();
}

c10::DeviceType FlagosGeneratorImpl::device_type() { return kFlagos; }

FlagosGeneratorImpl* FlagosGeneratorImpl::clone_impl() const {
  return new FlagosGeneratorImpl(device().index(), native_.clone());
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  device = resolve_device(device);
  // Leaked, like the native devices' default generators.
  static auto* generators = new std::array<at::Generator, kMaxDevices>();
  static auto* once = new std::array<std::once_flag, kMaxDevices>();
  std::call_once((*once)[device], [device] {
    (*generators)[device] =
        at::make_generator<FlagosGeneratorImpl>(device, make_default_native(device));
  });
  return (*generators)[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  device = resolve_device(device);
  return at::make_generator<FlagosGeneratorImpl>(device, make_native(device));
}

at::Generator native_generator(const std::optional<at::Generator>& gen,
                               c10::DeviceIndex device) {
  const at::Generator& g =
      (gen.has_value() && gen->defined()) ? *gen : default_generator(device);
  // ATen's words (check_generator), as the CPU and CUDA kernels say them.
  TORCH_CHECK(g.device().type() == kFlagos, "Expected a '", c10::DeviceType(kFlagos),
              "' device type for generator but found '", g.device().type(), "'");
  return static_cast<FlagosGeneratorImpl*>(g.unsafeGetGeneratorImpl())->native();
}

}  // namespace torch_fl::runtime
