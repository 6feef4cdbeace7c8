#pragma once

// Comparing a call's outputs with a reference kernel's, with tolerances per
// dtype: what shadow verification and tuning call "correct".
//
// An element passes when |got - ref| <= atol + rtol * |ref|, or both are the
// same infinity, or both are NaN. Integer and bool outputs must be equal.
// The default tolerances are those the project's FlagGems tests use against
// native CUDA (tests/python/test_flaggems.py); complex tensors use their
// component dtype's.
//
//   dtype      rtol     atol
//   float64    1e-7     1e-7
//   float32    1.3e-5   1e-5
//   float16    1e-3     1e-3
//   bfloat16   1.6e-2   1e-2
//   float8     twice the format's epsilon (rtol = atol)

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace torch_fl::aten {

struct Tolerance {
  double rtol;
  double atol;
};

Tolerance tolerance(at::ScalarType dtype);
// Replaces the tolerance of a floating dtype (torch_fl.verify.set_tolerance).
void set_tolerance(at::ScalarType dtype, Tolerance tol);
void reset_tolerances();

struct Comparison {
  bool ok = true;
  double max_abs = 0;  // largest |got - ref| over every output element
  // Largest |got - ref| / |ref| over the elements with |ref| >= atol (smaller
  // ones are judged by atol alone).
  double max_rel = 0;
  std::string problem;  // the first failing output, in words
};

// Compares outputs pairwise; labels[i] names output i ("result 0",
// "argument 'out' (written)"). `got` may hold flagos or native tensors,
// `ref` native ones. Runs on the native device and waits for it.
Comparison compare_outputs(const std::vector<c10::IValue>& got,
                           const std::vector<c10::IValue>& ref,
                           const std::vector<std::string>& labels);

}  // namespace torch_fl::aten
