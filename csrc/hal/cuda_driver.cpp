// The cuda driver: NVIDIA GPUs through the CUDA runtime API. Device ordinals
// are CUDA's. Above the HAL, the runtime hands memory, streams, events and
// generators to PyTorch's own CUDA implementations (runtime/cuda_bridge.cpp)
// so that flagos and torch.cuda share one memory pool and one notion of the
// current stream; the methods here serve the HAL contract and the runtime's
// synchronous needs (device count, synchronisation, memory info, copies).

#include <cuda_runtime_api.h>

#include <string>

#include "hal/driver.h"

namespace torch_fl::hal {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(err));
  }
}

// Makes `device` current for a scope and restores the previous device: the
// HAL's calls name their device, CUDA's act on the current one.
class DeviceSwitch {
 public:
  explicit DeviceSwitch(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
    switched_ = previous_ != device;
  }
  ~DeviceSwitch() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceSwitch(const DeviceSwitch&) = delete;
  DeviceSwitch& operator=(const DeviceSwitch&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

class CudaDriver final : public Driver {
 public:
  explicit CudaDriver(int count) : count_(count) {}

  std::string_view name() const noexcept override { return "cuda"; }
  NativeDevice nativeDevice() const noexcept override { return NativeDevice::kCuda; }

  int deviceCount() const noexcept override { return count_; }
  void setDevice(int device) override { check(cudaSetDevice(device), "cudaSetDevice"); }
  int currentDevice() const override {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  void synchronizeDevice(int device) override {
    DeviceSwitch on(device);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  void* allocate(int device, size_t nbytes) override {
    DeviceSwitch on(device);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error state
      return nullptr;
    }
    check(err, "cudaMalloc");
    return p;
  }
  void deallocate(int /*device*/, void* ptr, size_t /*nbytes*/) noexcept override {
    (void)cudaFree(ptr);
  }
  MemoryInfo memoryInfo(int device) const override {
    DeviceSwitch on(device);
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return {free_b, total_b};
  }
  void copy(void* dst, const void* src, size_t nbytes, CopyKind kind,
            StreamHandle stream, bool async) override {
    if (nbytes == 0) return;
    cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                       : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                         : cudaMemcpyDeviceToDevice;
    auto s = static_cast<cudaStream_t>(stream);
    check(cudaMemcpyAsync(dst, src, nbytes, k, s), "cudaMemcpyAsync");
    if (!async) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }

  StreamHandle defaultStream(int /*device*/) override { return nullptr; }  // legacy stream
  StreamHandle createStream(int device, int priority) override {
    DeviceSwitch on(device);
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority),
          "cudaStreamCreateWithPriority");
    return s;
  }
  void destroyStream(StreamHandle stream) noexcept override {
    if (stream != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  bool queryStream(StreamHandle stream) override {
    cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(err, "cudaStreamQuery");
    return true;
  }
  void synchronizeStream(StreamHandle stream) override {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
  }

  EventHandle createEvent(int device, bool enable_timing) override {
    DeviceSwitch on(device);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(
              &e, enable_timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    return e;
  }
  void destroyEvent(EventHandle event) noexcept override {
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void recordEvent(EventHandle event, StreamHandle stream) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
          "cudaEventRecord");
  }
  bool queryEvent(EventHandle event) override {
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(err, "cudaEventQuery");
    return true;
  }
  void synchronizeEvent(EventHandle event) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
  }
  void streamWaitEvent(StreamHandle stream, EventHandle event) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                              static_cast<cudaEvent_t>(event), 0),
          "cudaStreamWaitEvent");
  }
  double elapsedMs(EventHandle start, EventHandle end) override {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start),
                               static_cast<cudaEvent_t>(end)),
          "cudaEventElapsedTime");
    return ms;
  }

 private:
  int count_;
};

std::unique_ptr<Driver> make_cuda(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")";
    return nullptr;
  }
  if (count == 0) {
    *why = "no CUDA device is visible";
    return nullptr;
  }
  return std::make_unique<CudaDriver>(count);
}

const bool kRegistered = register_driver("cuda", &make_cuda);

}  // namespace
}  // namespace torch_fl::hal
