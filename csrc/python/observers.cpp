// Bindings of the call observers (csrc/aten/call_observer.h): shadow
// verification, tuning and profiling. torch_fl.verify, torch_fl.tuning and
// torch_fl.report are their Python faces.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>

#include "aten/call_observer.h"
#include "aten/output_compare.h"
#include "aten/shadow_verify.h"
#include "aten/tune_recorder.h"

namespace py = pybind11;

namespace torch_fl::python {
namespace {

at::ScalarType to_dtype(const py::object& obj) {
  TORCH_CHECK_TYPE(THPDtype_Check(obj.ptr()), "expected a torch.dtype, got ",
                   std::string(py::str(py::type::of(obj).attr("__name__"))));
  return reinterpret_cast<THPDtype*>(obj.ptr())->scalar_type;
}

const char* mode_text(aten::VerifyMode m) {
  switch (m) {
    case aten::VerifyMode::kReport: return "1";
    case aten::VerifyMode::kError: return "error";
    default: return "0";
  }
}

py::dict backend_result(const aten::BackendResult& r) {
  py::dict d;
  d["backend"] = r.backend;
  d["status"] = r.status;
  d["same_as"] = r.same_as;
  d["note"] = r.note;
  d["host_us"] = r.host_us;
  d["device_us"] = r.device_us;
  d["iters"] = r.iters;
  d["synchronizes"] = r.synchronizes;
  d["checked"] = r.checked;
  d["correct"] = r.correct;
  d["max_abs"] = r.max_abs;
  d["max_rel"] = r.max_rel;
  d["problem"] = r.problem;
  return d;
}

template <class F>
auto guarded(F&& f) {
  HANDLE_TH_ERRORS
  return f();
  END_HANDLE_TH_ERRORS_PYBIND
}

}  // namespace

void bind_observers(py::module_& m) {
  // ---- shadow verification ---------------------------------------------------
  m.def("_verify_mode", [] { return std::string(mode_text(aten::verify_mode())); });
  m.def("_set_verify_mode", [](std::optional<std::string> mode) {
    guarded([&] {
      if (!mode) {
        aten::set_api_verify_mode(std::nullopt);
      } else if (*mode == "0") {
        aten::set_api_verify_mode(aten::VerifyMode::kOff);
      } else if (*mode == "1") {
        aten::set_api_verify_mode(aten::VerifyMode::kReport);
      } else if (*mode == "error") {
        aten::set_api_verify_mode(aten::VerifyMode::kError);
      } else {
        TORCH_CHECK_VALUE(false, "verify mode '", *mode, "' is not valid: use 1, error or 0");
      }
      return 0;
    });
  });
  m.def("_verify_records", [] {
    py::list out;
    for (const auto& r : aten::verify_records()) {
      py::dict d;
      d["op"] = r.op;
      d["backend"] = r.backend;
      d["compared"] = r.compared;
      d["failed"] = r.failed;
      d["skipped"] = r.skipped;
      d["max_abs"] = r.max_abs;
      d["max_rel"] = r.max_rel;
      d["first_failure_call"] = r.first_failure_call;
      d["first_failure"] = r.first_failure;
      d["skip_reason"] = r.skip_reason;
      out.append(d);
    }
    return out;
  });
  m.def("_reset_verify_records", [] { aten::reset_verify_records(); });
  m.def("_reference_backend", [] { return std::string(aten::reference_backend_name()); });
  m.def("_tolerance", [](const py::object& dtype) {
    return guarded([&] {
      auto t = aten::tolerance(to_dtype(dtype));
      return py::make_tuple(t.rtol, t.atol);
    });
  });
  m.def("_set_tolerance", [](const py::object& dtype, double rtol, double atol) {
    guarded([&] {
      aten::set_tolerance(to_dtype(dtype), {rtol, atol});
      return 0;
    });
  });
  m.def("_reset_tolerances", [] { aten::reset_tolerances(); });

  // ---- tuning ----------------------------------------------------------------
  m.def("_tune_start", [](double budget_ms, int max_iters, size_t cpu_copy_max_bytes) {
    guarded([&] {
      aten::start_tuning({budget_ms, max_iters, cpu_copy_max_bytes});
      return 0;
    });
  });
  m.def("_tune_stop", [] { aten::stop_tuning(); });
  m.def("_tuning", [] { return aten::tuning(); });
  m.def("_tune_records", [] {
    py::list out;
    for (const auto& r : aten::tune_records()) {
      py::dict d;
      d["op"] = r.op;
      d["signature"] = r.signature;
      d["calls"] = r.calls;
      d["route"] = r.route;
      d["skipped"] = r.skipped;
      d["reference"] = r.reference;
      py::list results;
      for (const auto& b : r.results) results.append(backend_result(b));
      d["results"] = results;
      out.append(d);
    }
    return out;
  });

  // ---- profiling ---------------------------------------------------------------
  m.def("_set_profiling", [](bool on) { aten::set_observer(aten::kObserveProfile, on); });
  m.def("_profile_records", [] {
    py::list out;
    for (const auto& r : aten::profile_records()) {
      py::dict d;
      d["op"] = r.op;
      d["backend"] = r.backend;
      d["calls"] = r.calls;
      d["host_us"] = r.host_us;
      out.append(d);
    }
    return out;
  });
}

}  // namespace torch_fl::python
