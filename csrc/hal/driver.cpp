#include "hal/driver.h"

#include <atomic>
#include <mutex>

#include "hal/env.h"
#include "hal/host_driver.h"

namespace torch_fl::hal {
namespace {

// Drivers other than host register themselves here when they are compiled in
// (see cuda_driver.cpp); each factory returns nullptr when its hardware is not
// usable on this machine, with the reason in *why.
struct Entry {
  const char* name;
  Factory factory;
};

Entry* extra_drivers() {
  static Entry entries[4] = {};
  return entries;
}

std::unique_ptr<Driver> make_driver() {
  std::string choice = env_value("FLAGOS_ACCELERATOR").value_or("auto");
  HostDriver::check_environment();
  if (choice == "host") return std::make_unique<HostDriver>();
  for (Entry* e = extra_drivers(); e->name != nullptr; ++e) {
    if (choice == e->name || choice == "auto") {
      std::string why;
      auto d = e->factory(&why);
      if (d) return d;
      if (choice != "auto") {
        throw Error("FLAGOS_ACCELERATOR=" + choice +
                    " was asked for but cannot run here: " + why +
                    ". Use FLAGOS_ACCELERATOR=host (or auto) on this machine.");
      }
    }
  }
  if (choice == "auto") return std::make_unique<HostDriver>();
  throw ConfigError("FLAGOS_ACCELERATOR='" + choice +
                    "' is not a driver: valid values are auto, " +
                    available_drivers() + " (drivers built into this torch_fl)");
}

}  // namespace

bool register_driver(const char* name, Factory factory) {
  Entry* e = extra_drivers();
  while (e->name != nullptr) ++e;
  *e = Entry{name, factory};
  return true;
}

std::string available_drivers() {
  std::string names = "host";
  for (Entry* e = extra_drivers(); e->name != nullptr; ++e) {
    names += ", ";
    names += e->name;
  }
  return names;
}

namespace detail {
std::atomic<Driver*> g_driver{nullptr};
}

Driver& driver() {
  // Not a function-local static: a failed construction must be retried (and
  // fail again with the same message). Leaked on purpose: tensors freed during
  // interpreter shutdown still call into the driver.
  static std::mutex mu;
  if (Driver* d = detail::g_driver.load(std::memory_order_acquire)) return *d;
  std::lock_guard<std::mutex> lock(mu);
  if (detail::g_driver.load() == nullptr) detail::g_driver.store(make_driver().release());
  return *detail::g_driver.load();
}

}  // namespace torch_fl::hal
