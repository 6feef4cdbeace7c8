#include "python/flaggems.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include "aten/op_plan.h"
#include "flaggems/cuda_launch.h"
#include "flaggems/disk_cache.h"
#include "flaggems/launcher.h"
#include "flaggems/plan.h"
#include "flaggems/python_side.h"

namespace py = pybind11;

namespace torch_fl::python {
namespace {

using namespace torch_fl::flaggems;

abi::Attr attr_of(const py::handle& a) {
  if (a.is_none()) return abi::Attr::kNone;
  if (!py::isinstance<py::str>(a)) return abi::Attr::kNone;  // ("i32", 1): no attribute
  const std::string s = a.cast<std::string>();
  return s == "D" ? abi::Attr::kDiv16 : abi::Attr::kEmpty;
}

py::object attr_obj(abi::Attr a) {
  if (a == abi::Attr::kNone) return py::none();
  return py::str(a == abi::Attr::kDiv16 ? "D" : "");
}

KernelBinary binary_of(const py::dict& d) {
  KernelBinary b;
  b.name = d["name"].cast<std::string>();
  b.hash = d["hash"].cast<std::string>();
  b.cubin = d["cubin"].cast<std::string>();
  b.shared = d["shared"].cast<uint32_t>();
  b.num_warps = d["num_warps"].cast<int>();
  b.num_stages = d["num_stages"].cast<int>();
  b.num_ctas = d["num_ctas"].cast<int>();
  b.global_scratch = d["global_scratch"].cast<int64_t>();
  b.profile_scratch = d["profile_scratch"].cast<int64_t>();
  b.cooperative = d["cooperative"].cast<bool>();
  b.pdl = d["pdl"].cast<bool>();
  b.tensor_descriptors = d["tensor_descriptors"].cast<bool>();
  if (d.contains("entry_sizes")) b.entry_sizes = d["entry_sizes"].cast<std::vector<int>>();
  return b;
}

abi::Value value_of(const py::handle& kind_h, const py::handle& a, const py::handle& b,
                    bool* supported) {
  const std::string kind = kind_h.cast<std::string>();
  *supported = true;
  if (kind == "ptr") {
    return abi::Value::pointer(a.cast<uint64_t>(), abi::type_from_name(b.cast<std::string>()));
  }
  if (kind == "int") return abi::Value::integer(a.cast<int64_t>());
  if (kind == "float") return abi::Value::floating(a.cast<double>());
  if (kind == "bool") return abi::Value::boolean(a.cast<bool>());
  if (kind == "none") return abi::Value::none();
  *supported = false;
  return abi::Value::none();
}

py::object python_value(const abi::Value& v) {
  switch (v.kind) {
    case abi::Kind::kInt:
      return py::int_(v.i);
    case abi::Kind::kFloat:
      return py::float_(v.f);
    case abi::Kind::kBool:
      return py::bool_(v.b);
    default:
      return py::none();
  }
}

// torch_fl/_flaggems_cpp.py behind the PythonSide interface.
class PySide final : public PythonSide {
 public:
  explicit PySide(py::object impl) : impl_(std::move(impl)) {}

  void with_gil(const std::function<void()>& f) override {
    py::gil_scoped_acquire gil;
    f();
  }

  ExportedFn export_fn(const std::string& ref) override {
    py::gil_scoped_acquire gil;
    ExportedFn e;
    try {
      py::dict d = impl_.attr("export_fn")(ref);
      if (d.contains("error")) {
        e.error = d["error"].cast<std::string>();
        return e;
      }
      e.cache_key = d["cache_key"].cast<std::string>();
      for (const auto& p : d["params"].cast<py::list>()) {
        auto t = p.cast<py::tuple>();
        abi::ParamInfo info;
        e.names.push_back(t[0].cast<std::string>());
        info.is_constexpr = t[1].cast<bool>();
        const std::string ann = t[2].cast<std::string>();
        if (!ann.empty()) {
          info.annotation = abi::type_from_name(ann);
          if (info.annotation == abi::TType::kInvalid) {
            e.error = "parameter '" + e.names.back() + "' has annotation '" + ann +
                      "', which the C++ launcher does not model";
            return e;
          }
        }
        info.do_not_specialize = t[3].cast<bool>();
        info.do_not_specialize_on_alignment = t[4].cast<bool>();
        info.is_const = t[5].cast<bool>();
        e.params.push_back(info);
      }
      e.id = d["id"].cast<int>();
    } catch (py::error_already_set& err) {
      e.error = err.what();
      e.id = -1;
    }
    return e;
  }

  PointwiseInfo pointwise(const std::string& ref) override {
    py::gil_scoped_acquire gil;
    PointwiseInfo info;
    try {
      py::dict d = impl_.attr("pointwise_info")(ref);
      if (d.contains("error")) {
        info.error = d["error"].cast<std::string>();
        return info;
      }
      info.is_tensor = d["is_tensor"].cast<std::vector<bool>>();
      for (const auto& p : d["promotions"].cast<py::list>()) {
        auto t = p.cast<py::tuple>();
        const std::string m = t[1].cast<std::string>();
        using M = PointwiseInfo::Method;
        const M method = m == "DEFAULT"        ? M::kDefault
                         : m == "NO_OPMATH"    ? M::kNoOpmath
                         : m == "INT_TO_FLOAT" ? M::kIntToFloat
                         : m == "ALWAYS_BOOL"  ? M::kAlwaysBool
                         : m == "BOOL_TO_LONG" ? M::kBoolToLong
                                               : M::kOther;
        info.promotions.push_back({t[0].cast<std::vector<int>>(), method});
      }
      info.max_tile = d["max_tile"].cast<int>();
      info.max_grid0 = d["max_grid0"].cast<int>();
      info.block_pointer = d["block_pointer"].cast<bool>();
      info.tile_1d = d["tile_1d"].cast<bool>();
    } catch (py::error_already_set& err) {
      info.error = err.what();
    }
    return info;
  }

  void capture_begin() override {
    py::gil_scoped_acquire gil;
    impl_.attr("capture_begin")();
  }

  Capture capture_end() override {
    py::gil_scoped_acquire gil;
    Capture cap;
    try {
      py::dict d = impl_.attr("capture_end")();
      cap.total = d["total"].cast<int>();
      cap.error = d["error"].cast<std::string>();
      for (const auto& l : d["launches"].cast<py::list>()) {
        py::dict ld = l.cast<py::dict>();
        CapturedLaunch L;
        L.fn_id = ld["fn_id"].cast<int>();
        auto grid = ld["grid"].cast<std::vector<int64_t>>();
        for (size_t g = 0; g < 3 && g < grid.size(); ++g) L.grid[g] = static_cast<uint32_t>(grid[g]);
        L.binary = binary_of(ld["binary"].cast<py::dict>());
        for (const auto& a : ld["args"].cast<py::list>()) {
          auto t = a.cast<py::tuple>();
          CapturedArg ca;
          ca.value = value_of(t[0], t[1], t[2], &ca.supported);
          if (!ca.supported) ca.repr = py::str(t[1]).cast<std::string>();
          ca.spec_type = t[3].cast<std::string>();
          ca.spec_attr = attr_of(t[4]);
          L.args.push_back(std::move(ca));
        }
        cap.launches.push_back(std::move(L));
      }
    } catch (py::error_already_set& err) {
      cap.error = err.what();
    }
    return cap;
  }

  KernelBinary compile(const CompileRequest& req, std::string* error) override {
    py::gil_scoped_acquire gil;
    try {
      py::list specs;
      for (size_t i = 0; i < req.specs.size(); ++i) {
        const abi::Spec& s = req.specs[i];
        if (s.dropped) {
          specs.append(py::make_tuple("constexpr", python_value(req.values[i])));
        } else {
          std::string t = s.pointer ? "*" : "";
          t += abi::type_name(s.type);
          specs.append(py::make_tuple(t, attr_obj(s.attr)));
        }
      }
      py::dict d = impl_.attr("compile")(req.fn_id, specs, req.num_warps, req.num_stages);
      return binary_of(d);
    } catch (py::error_already_set& err) {
      *error = err.what();
      return {};
    }
  }

 private:
  py::object impl_;
};

c10::OperatorHandle find_op(const std::string& name) {
  auto op = c10::Dispatcher::singleton().findSchema(aten::aten_operator_name(name));
  TORCH_CHECK_VALUE(op.has_value(), "no aten operator '", name, "'");
  return *op;
}

std::vector<c10::IValue> stack_of(const std::string& name, const py::tuple& args,
                                  const py::dict& kwargs) {
  auto op = find_op(name);
  py::kwargs kw;
  for (auto item : kwargs) kw[item.first] = item.second;
  return torch::jit::createStackForSchema(op.schema(), torch::jit::tuple_slice(args), kw,
                                          std::nullopt);
}

}  // namespace

void init_flaggems(py::module& m) {
  m.def("_flaggems_set_python_side", [](py::object impl) {
    static PySide* side = nullptr;  // leaked: called by kernels until exit
    side = new PySide(std::move(impl));
    set_python_side(side);
  });
  m.def("_flaggems_install", [](const std::vector<std::string>& ops, const std::string& triton,
                                bool stub_only) {
    HANDLE_TH_ERRORS
    install(ops, triton, stub_only);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_flaggems_cpp_enabled", [] { return cpp_enabled(); });
  m.def("_flaggems_set_cpp_enabled", [](bool on) { set_cpp_enabled(on); });
  m.def("_flaggems_described_ops", [] { return described_ops(); });
  m.def("_flaggems_all_described_ops", [] {
    size_t n = 0;
    OpDesc* ops = op_table(&n);
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i) out.emplace_back(ops[i].aten);
    return out;
  });
  m.def("_flaggems_stats", [] {
    py::dict d;
    for (const auto& [k, v] : stats()) d[py::str(k)] = v;
    py::dict per;
    for (const auto& [op, v] : op_stats()) per[py::str(op)] = py::make_tuple(v[0], v[1], v[2]);
    d["ops"] = per;
    d["pinned"] = pinned();
    return d;
  });
  m.def("_flaggems_disk_dir", [] { return disk::directory(); });
  m.def("_flaggems_override_device", [](int arch, int sms) { cuda::override_device(arch, sms); });
  m.def("_flaggems_dry_run", [](bool on) { cuda::set_dry_run(on); });
  m.def("_flaggems_plan", [](const std::string& op, py::tuple args, py::dict kwargs) {
    HANDLE_TH_ERRORS
    PlanReport r = plan_only(op, stack_of(op, args, kwargs));
    py::list launches;
    for (const auto& L : r.launches) {
      py::dict d;
      d["fn_id"] = L.fn_id;
      d["fn"] = L.fn_ref;
      d["grid"] = py::make_tuple(L.grid[0], L.grid[1], L.grid[2]);
      d["num_warps"] = L.num_warps;
      d["num_stages"] = L.num_stages;
      d["names"] = L.names;
      d["specs"] = L.specs;
      d["values"] = L.values;
      launches.append(d);
    }
    py::dict out;
    out["outcome"] = r.outcome;
    out["launches"] = launches;
    out["results"] = r.results;
    return out;
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_flaggems_compile_hashes", [](const std::string& op, py::tuple args, py::dict kwargs) {
    HANDLE_TH_ERRORS
    return compile_plan(op, stack_of(op, args, kwargs));
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_flaggems_check", [](const std::string& op, py::tuple args, py::dict kwargs,
                              py::function run_wrapper) {
    HANDLE_TH_ERRORS
    auto handle = find_op(op);
    const auto& returns = handle.schema().returns();
    auto run = [&]() {
      py::object out = run_wrapper();
      std::vector<c10::IValue> results;
      if (returns.size() == 1) {
        results.push_back(torch::jit::toIValue(out, returns[0].real_type()));
      } else {
        py::tuple t = out.cast<py::tuple>();
        for (size_t i = 0; i < returns.size(); ++i) {
          results.push_back(torch::jit::toIValue(t[i], returns[i].real_type()));
        }
      }
      return results;
    };
    return check_against_capture(op, stack_of(op, args, kwargs), run);
    END_HANDLE_TH_ERRORS_PYBIND
  });
}

}  // namespace torch_fl::python
