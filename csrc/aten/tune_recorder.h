#pragma once

// Tuning (torch_fl.tuning, `python -m torch_fl tune`): while it is on, every
// routed call is counted by its signature (call_signature.h), and the first
// call of each new signature is measured on every backend of this driver
// that serves the operator:
//
//  - copies of the call's inputs are taken before the workload's own call
//    runs (that call then runs as usual, on its own tensors: the workload's
//    results are those of an untuned run);
//  - the reference kernels (shadow_verify.h) run once on their own copies;
//  - each candidate backend runs once on fresh copies and its outputs are
//    compared with the reference's (output_compare.h): a backend that
//    diverges, or raises, is not correct for this signature;
//  - then it is timed on those copies: after warm-up calls, three batches of
//    n back-to-back calls (n from a time budget), taking the median batch.
//    Host time per call is the time to issue a batch; device time per call
//    comes from driver events around the batch. On the cuda driver the stream
//    is first held by a spin kernel so the calls queue up and the events time
//    them back to back; a call that synchronises with the host is timed
//    without it and marked. On the host driver work is inline: both times are
//    the wall time.
//
// Copies live only during the measurement. Random operators (their second run
// would move the random stream), operators outside the aten namespace
// (collectives must not run twice) and calls made during CUDA graph capture are
// counted but not measured. Backends that run the same kernels are measured
// once (cpu and native on the host driver, cuda and native on the cuda
// driver); the cpu copy round trip on the cuda driver is measured only for
// small inputs.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "aten/op_plan.h"

namespace torch_fl::aten {

struct TuneOptions {
  double budget_ms = 10;  // timing budget per signature and backend
  int max_iters = 100;    // calls per timed batch, at most
  size_t cpu_copy_max_bytes = size_t(1) << 20;  // cpu round trip: inputs up to this
};

// Clears earlier records and turns recording on; throws if already on.
void start_tuning(const TuneOptions& options);
void stop_tuning();
bool tuning() noexcept;

struct BackendResult {
  std::string backend;
  // "timed"; "same" (the same kernels as `same_as`, measured there);
  // "declined" (flaggems cannot take these arguments: a flaggems route runs
  // them on native); "error" (the backend raised); "not timed" (see note).
  std::string status;
  std::string same_as;
  std::string note;
  double host_us = 0;    // per call
  double device_us = 0;  // per call
  int iters = 0;         // calls per timed batch
  bool synchronizes = false;
  bool checked = false;  // compared with the reference
  bool correct = false;
  double max_abs = 0;
  double max_rel = 0;
  std::string problem;  // why not correct
};

struct SignatureRecord {
  std::string op;         // "aten::mm"
  std::string signature;  // call_signature()
  uint64_t calls = 0;
  std::string route;      // the operator's route during the run
  std::string skipped;    // why it was not measured ("" when measured)
  std::string reference;  // the reference backend ("cpu", "cuda")
  std::vector<BackendResult> results;
};
std::vector<SignatureRecord> tune_records();

// ---- the observer's side (call_observer.cpp) ------------------------------------
// A measurement to do after the workload's call: the key of the new
// signature and copies of the call's inputs, taken before it ran.
struct TuneJob {
  size_t record;
  torch::jit::Stack inputs;
};
// Counts the call; returns a job when it is the first of a signature that is
// measured.
std::optional<TuneJob> tune_note_call(const c10::OperatorHandle& op, const OpPlan& plan,
                                      const c10::IValue* args);
void tune_measure(const c10::OperatorHandle& op, const OpPlan& plan, TuneJob& job);

}  // namespace torch_fl::aten
