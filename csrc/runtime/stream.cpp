#include "runtime/stream.h"

#include <array>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>

#include <c10/util/Exception.h>

#include "runtime/cuda_bridge.h"
#include "runtime/device.h"

namespace torch_fl::runtime {
namespace {

constexpr int kMaxDevices = 64;
constexpr c10::StreamId kMaxStreams = 4096;
// Ids from here on are no stream: every stream is the default one or a pool's.
constexpr c10::StreamId kFirstNew = 2 * kStreamPoolSize + 1;

struct DeviceStreams {
  std::array<std::atomic<hal::StreamHandle>, kMaxStreams> handles{};
  std::atomic<uint32_t> next_pool[2] = {0, 0};
  std::mutex create_mu;
};

DeviceStreams& streams_of(c10::DeviceIndex device) {
  // Leaked: streams stay valid for threads still running at exit.
  static auto* table = new std::array<DeviceStreams, kMaxDevices>();
  return (*table)[device];
}

// Per-thread current stream id of each device (0: the default stream). Ids
// are below kMaxStreams, so 16 bits hold one: the library's thread-locals stay
// within the loader's static TLS space (CMakeLists.txt, TLS descriptors).
static_assert(kMaxStreams - 1 <= std::numeric_limits<int16_t>::max());
thread_local std::array<int16_t, kMaxDevices> tls_current{};

hal::StreamHandle create_handle(c10::DeviceIndex device, c10::StreamId id) {
  if (id == 0) return driver().defaultStream(device);
  return driver().createStream(device, stream_priority(id));
}

hal::StreamHandle handle_for(c10::DeviceIndex device, c10::StreamId id) {
  auto& ds = streams_of(device);
  hal::StreamHandle h = ds.handles[id].load(std::memory_order_acquire);
  if (h != nullptr) return h;
  std::lock_guard<std::mutex> lock(ds.create_mu);
  h = ds.handles[id].load();
  if (h == nullptr) {
    h = create_handle(device, id);
    ds.handles[id].store(h, std::memory_order_release);
  }
  return h;
}

c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kFlagos, device), id);
}

}  // namespace

int stream_priority(c10::StreamId id) noexcept {
  return id > kStreamPoolSize && id <= 2 * kStreamPoolSize ? kGreatestPriority : kLeastPriority;
}

c10::Stream default_stream(c10::DeviceIndex device) {
  device = resolve_device(device);
  return make_stream(device, 0);
}

c10::Stream pool_stream(c10::DeviceIndex device, bool high_priority) {
  device = resolve_device(device);
  auto& counter = streams_of(device).next_pool[high_priority ? 1 : 0];
  c10::StreamId idx = counter.fetch_add(1) % kStreamPoolSize;
  return make_stream(device, 1 + idx + (high_priority ? kStreamPoolSize : 0));
}

c10::Stream new_stream(c10::DeviceIndex device, int priority) {
  // As CUDA's getNewStream (getStreamFromPool): torch.flagos.Stream() and
  // torch.Stream("flagos") take the next stream of the pool of their
  // priority, so a program may make streams in a loop without running out.
  return pool_stream(device, priority < 0);
}

c10::StreamId current_stream_id_unchecked(c10::DeviceIndex device) noexcept {
  return tls_current[device];
}

c10::Stream current_stream(c10::DeviceIndex device) {
  device = resolve_device(device);
  return make_stream(device, tls_current[device]);
}

c10::Stream exchange_stream(c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kFlagos, "expected a flagos stream, got a ",
              stream.device_type(), " stream");
  auto device = resolve_device(stream.device_index());
  stream_handle(stream);  // validates the id
  auto prev = make_stream(device, tls_current[device]);
  tls_current[device] = static_cast<int16_t>(stream.id());
  return prev;
}

hal::StreamHandle stream_handle(const c10::Stream& stream) {
  auto device = stream.device_index();
  check_device_index(device);
  auto id = stream.id();
  TORCH_CHECK(id >= 0 && id < kFirstNew, "unknown flagos stream id ", id,
              " on device ", static_cast<int>(device));
  return handle_for(device, id);
}

}  // namespace torch_fl::runtime

namespace torch_fl::runtime {

hal::StreamHandle current_stream_handle(c10::DeviceIndex device) {
  if (uses_cuda()) return cuda::current_stream_handle(device);
  return stream_handle(current_stream(device));
}

}  // namespace torch_fl::runtime
