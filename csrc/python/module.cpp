// torch_fl._C: the thin binding the Python package wires together. Streams and
// events need no binding: torch.Stream / torch.Event reach the flagos device
// guard directly.

#include <limits>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include "aten/fallback.h"
#include "aten/provider_error.h"
#include "aten/python_provider.h"
#include "aten/rnn_cells.h"
#include "hal/driver.h"
#include "hal/system_memory.h"
#include "python/distributed.h"
#include "python/flaggems.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "routing/config.h"
#include "routing/table.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "runtime/intra_op_threads.h"
#include "runtime/stream.h"

namespace py = pybind11;

namespace torch_fl::python {

void bind_observers(py::module_& m);  // observers.cpp
void init_ipc(py::module_& m);        // ipc.cpp

namespace {

using runtime::device_allocator;

// A Python int as a device index: values outside DeviceIndex's range are
// rejected here rather than wrapped into a different, valid-looking index.
c10::DeviceIndex to_index(int d) {
  TORCH_CHECK(d >= -1 && d <= std::numeric_limits<c10::DeviceIndex>::max(),
              "flagos device index ", d, " is out of range");
  return static_cast<c10::DeviceIndex>(d);
}

// Runs `f`, turning C++ errors into the Python exceptions torch users expect
// (ValueError, torch.OutOfMemoryError, RuntimeError).
template <typename F>
auto guarded(F&& f) {
  HANDLE_TH_ERRORS
  try {
    return f();
  } catch (const hal::ConfigError& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  END_HANDLE_TH_ERRORS_PYBIND
}

py::dict memory_stats(int device) {
  auto stats = guarded([&] { return device_allocator().getDeviceStats(to_index(device)); });
  py::dict out;
  const char* pools[] = {"all", "small_pool", "large_pool"};
  auto add_stat = [&](const std::string& name, const c10::CachingAllocator::Stat& stat) {
    out[py::str(name + ".current")] = stat.current;
    out[py::str(name + ".peak")] = stat.peak;
    out[py::str(name + ".allocated")] = stat.allocated;
    out[py::str(name + ".freed")] = stat.freed;
  };
  auto add_array = [&](const char* name, const auto& arr) {
    for (size_t p = 0; p < 3; ++p) add_stat(std::string(name) + "." + pools[p], arr[p]);
  };
  // Every key torch.cuda.memory_stats() has. The host driver's allocator never
  // splits a block or keeps an oversize one, so those counters stay 0 there.
  add_array("allocation", stats.allocation);
  add_array("segment", stats.segment);
  add_array("active", stats.active);
  add_array("inactive_split", stats.inactive_split);
  add_array("allocated_bytes", stats.allocated_bytes);
  add_array("reserved_bytes", stats.reserved_bytes);
  add_array("active_bytes", stats.active_bytes);
  add_array("inactive_split_bytes", stats.inactive_split_bytes);
  add_array("requested_bytes", stats.requested_bytes);
  add_stat("oversize_allocations", stats.oversize_allocations);
  add_stat("oversize_segments", stats.oversize_segments);
  out["num_alloc_retries"] = stats.num_alloc_retries;
  out["num_ooms"] = stats.num_ooms;
  out["num_sync_all_streams"] = stats.num_sync_all_streams;
  out["num_device_alloc"] = stats.num_device_alloc;
  out["num_device_free"] = stats.num_device_free;
  out["max_split_size"] = stats.max_split_size;
  return out;
}

// Python kernels of the flaggems provider, by id. Leaked: kernels may run
// until exit, when destroying Python objects is no longer safe.
std::vector<py::object>& python_kernels() {
  static auto* kernels = new std::vector<py::object>();
  return *kernels;
}

// An argument as Python sees it in a torch.library kernel. A boxed dtype,
// layout or memory format is an int in its IValue; only the schema says it
// is one, so it is converted by the argument's type (torch.float32, not 6).
py::object to_python(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isInt()) {
    c10::TypePtr type = arg.real_type();
    if (auto opt = type->castRaw<c10::OptionalType>()) type = opt->getElementType();
    switch (type->kind()) {
      case c10::TypeKind::ScalarTypeType:
        return py::reinterpret_borrow<py::object>(
            reinterpret_cast<PyObject*>(torch::getTHPDtype(v.toScalarType())));
      case c10::TypeKind::LayoutType:
        return py::reinterpret_borrow<py::object>(
            reinterpret_cast<PyObject*>(torch::getTHPLayout(v.toLayout())));
      case c10::TypeKind::MemoryFormatType:
        return py::reinterpret_borrow<py::object>(
            torch::utils::getTHPMemoryFormat(v.toMemoryFormat()));
      default:
        break;
    }
  }
  return torch::jit::toPyObject(v);
}

// A Python kernel's error that is not about the call's arguments
// (torch.OutOfMemoryError, or no Exception at all: KeyboardInterrupt,
// SystemExit): raised as pybind11's error, with the mark that keeps the native
// kernel from checking the arguments first (aten/provider_error.h).
struct PythonProviderError : py::error_already_set, aten::NotAboutArguments {
  explicit PythonProviderError(const py::error_already_set& e) : py::error_already_set(e) {}
};

// The invoker libtorch_fl calls (aten/python_provider.h): the arguments are
// native (CUDA) views; keyword-only schema arguments go as keywords, as
// torch.library passes them to Python kernels.
void invoke_python_kernel(int64_t id, const c10::OperatorHandle& op,
                          torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t base = stack->size() - args.size();
  py::list positional;
  py::dict keywords;
  std::vector<c10::IValue> written;  // returned when an in-place kernel returns None
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) written.push_back(v);
    py::object obj = to_python(args[i], v);
    if (args[i].kwarg_only()) {
      keywords[py::str(args[i].name())] = obj;
    } else {
      positional.append(obj);
    }
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  py::object out;
  try {
    out = python_kernels().at(static_cast<size_t>(id))(*py::tuple(positional), **keywords);
  } catch (const py::error_already_set& e) {
    static PyObject* out_of_memory =  // leaked: a type object, alive until exit
        py::object(py::module_::import("torch").attr("OutOfMemoryError")).release().ptr();
    if (!e.matches(PyExc_Exception) || e.matches(out_of_memory)) {
      throw PythonProviderError(e);
    }
    throw;
  }
  const auto& rets = schema.returns();
  if (rets.empty()) return;
  if (out.is_none() && rets.size() == written.size()) {
    for (auto& w : written) stack->push_back(std::move(w));
    return;
  }
  if (rets.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, rets[0].real_type()));
    return;
  }
  py::tuple tuple = py::reinterpret_borrow<py::tuple>(out);
  TORCH_CHECK(tuple.size() == rets.size(), "flaggems kernel for ", op.operator_name(),
              " returned ", tuple.size(), " values, the schema has ", rets.size());
  for (size_t i = 0; i < rets.size(); ++i) {
    stack->push_back(torch::jit::toIValue(tuple[i], rets[i].real_type()));
  }
}

}  // namespace
}  // namespace torch_fl::python

PYBIND11_MODULE(_C, m) {
  using namespace torch_fl;
  using python::guarded;
  m.doc() = "torch_fl native bindings";

  // Selects and validates the driver; the device itself initialises on first
  // use (runtime::lazy_init), which is what fork safety keys on.
  m.def("_init", [] {
    guarded([] {
      hal::Driver& d = hal::driver();
      aten::register_unboxed_routes();
      aten::register_direct_routes();
      aten::register_layout_routes();
      if (d.nativeDevice() == hal::NativeDevice::kHost) {
        aten::register_host_rnn_cells();
        runtime::register_pinned_host_allocator();
      }
      return 0;
    });
  });
  // torch.flagos.init(): the device itself, as torch.cuda.init() initialises
  // CUDA (and, like it, refuses in a child forked after that).
  m.def("_lazy_init", [] { guarded([] { runtime::lazy_init(); return 0; }); });
  m.def("_driver_name", [] {
    return guarded([] { return std::string(hal::driver().name()); });
  });
  m.def("_available_drivers", [] { return hal::available_drivers(); });
  m.def("_note_backward_threads", [](int threads) { runtime::note_backward_threads(threads); });
  m.def("_device_count", [] { return static_cast<int>(runtime::device_count()); });
  m.def("_current_device", [] {
    return guarded([] { return static_cast<int>(runtime::current_device()); });
  });
  m.def("_set_device", [](int d) {
    guarded([&] {
      runtime::set_device(python::to_index(d));
      return 0;
    });
  });
  m.def("_exchange_device", [](int d) {
    return guarded([&] {
      auto prev = runtime::current_device();
      if (d >= 0 && d != prev) runtime::set_device(python::to_index(d));
      return static_cast<int>(prev);
    });
  });
  m.def("_synchronize", [](int d) {
    guarded([&] {
      auto index = runtime::resolve_device(python::to_index(d));
      py::gil_scoped_release no_gil;
      hal::driver().synchronizeDevice(index);
      return 0;
    });
  });
  m.def("_memory_stats", [](int d) {
    return python::memory_stats(d);
  });
  m.def("_reset_peak_memory_stats", [](int d) {
    guarded([&] {
      runtime::device_allocator().resetPeakStats(python::to_index(d));
      return 0;
    });
  });
  m.def("_reset_accumulated_memory_stats", [](int d) {
    guarded([&] {
      runtime::device_allocator().resetAccumulatedStats(
          python::to_index(d));
      return 0;
    });
  });
  // For tests: the machine's available memory as the host allocator reads it
  // (bytes; negative: read the machine again).
  m.def("_override_available_memory", [](int64_t bytes) {
    hal::override_available_memory(bytes < 0 ? std::nullopt
                                             : std::optional<size_t>(static_cast<size_t>(bytes)));
  });
  // A host-driver stream's priority, and the range (least, greatest).
  m.def("_stream_priority", [](int64_t id) { return runtime::stream_priority(id); });
  m.def("_stream_priority_range", [] {
    return std::make_pair(runtime::kLeastPriority, runtime::kGreatestPriority);
  });
  m.def("_empty_cache", [] {
    guarded([] {
      runtime::device_allocator().emptyCache();
      return 0;
    });
  });
  m.def("_set_memory_fraction", [](double fraction, int d) {
    guarded([&] {
      runtime::device_allocator().setMemoryFraction(python::to_index(d), fraction);
      return 0;
    });
  });
  m.def("_memory_fraction", [](int d) {
    return guarded([&] { return runtime::device_allocator().memoryFraction(python::to_index(d)); });
  });
  m.def("_mem_get_info", [](int d) {
    return guarded([&] {
      return runtime::device_allocator().getMemoryInfo(
          python::to_index(d));
    });
  });
  m.def("_get_default_generator", [](int d) {
    return guarded([&] {
      const auto& gen =
          runtime::default_generator(python::to_index(d));
      return py::reinterpret_steal<py::object>(
          THPGenerator_initDefaultGenerator(gen));
    });
  });
  // ---- routing ----------------------------------------------------------
  m.def("_load_routing", [](const std::string& default_path) {
    return guarded([&] { return routing::load(default_path); });
  });
  m.def("_check_config", [](const std::string& path) {
    return guarded([&] { return routing::check_file(path); });
  });
  m.def("_parse_config", [](const py::bytes& text, const std::string& source) {
    // Grammar only (no operator or driver checks): for tests and fuzzing.
    auto parsed = routing::parse_config(std::string(text), source);
    py::list entries, errors;
    for (const auto& e : parsed.entries) {
      py::list chain;
      for (auto b : e.chain) chain.append(std::string(routing::backend_name(b)));
      entries.append(py::make_tuple(e.op, chain, e.line));
    }
    for (const auto& e : parsed.errors) {
      errors.append(py::make_tuple(e.line, py::bytes(e.token), e.to_string()));
    }
    return py::make_tuple(entries, errors);
  });
  m.def("_set_route", [](const std::string& op, const std::string& chain) {
    guarded([&] {
      routing::set_route(op, chain);
      return 0;
    });
  });
  m.def("_routing_table", [] {
    py::list rows;
    for (const auto& r : guarded([] { return routing::table(); })) {
      rows.append(py::make_tuple(r.op, r.backend, r.source, r.resolved, r.cpu_fallback, r.via));
    }
    return rows;
  });
  m.def("_routing_stats", [] {
    py::list rows;
    for (const auto& st : guarded([] { return routing::stats(); })) {
      py::dict calls;
      for (const auto& [b, n] : st.calls) calls[py::str(b)] = n;
      rows.append(py::make_tuple(st.op, calls, st.cpu_fallbacks));
    }
    return rows;
  });
  m.def("_reset_routing_stats", [] { routing::reset_stats(); });
  m.def("_available_backends", [] {
    std::vector<std::string> out;
    for (auto b : routing::available_backends()) out.emplace_back(routing::backend_name(b));
    return out;
  });
  m.def("_config_path", [] { return routing::config_path(); });
  // ---- the flaggems (Python kernel) provider -------------------------------
  m.def("_register_python_kernel", [](const std::string& op, py::object fn) {
    return guarded([&] {
      auto& kernels = python::python_kernels();
      kernels.push_back(std::move(fn));
      bool ok = aten::register_python_kernel(op, static_cast<int64_t>(kernels.size() - 1));
      if (ok) aten::set_python_invoker(&python::invoke_python_kernel);
      return ok;
    });
  });
  m.def("_clear_python_kernels", [] { aten::clear_python_kernels(); });
  m.def("_python_kernel_ops", [] { return aten::python_kernel_ops(); });
  m.def("_is_initialized", [] { return runtime::is_initialized(); });
  m.def("_is_in_bad_fork", [] { return runtime::is_in_bad_fork(); });
  python::init_distributed(m);
  python::bind_observers(m);
  python::init_flaggems(m);
  python::init_ipc(m);
}
