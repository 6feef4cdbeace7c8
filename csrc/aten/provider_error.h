#pragma once

// Errors of a provider (FlagGems' kernels) that are not about the call's
// arguments: a launch that failed, a plan that verification refused, memory,
// an interrupt. The boxed kernel raises them as they are; any other error of
// a FlagGems call has the native kernel check the call's arguments first
// (fallback.cpp, check_natively).

#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace torch_fl::aten {

// The mark, mixed into an exception type that a caller already knows how to
// raise (c10::Error, pybind11's error_already_set). Its key function lives in
// libtorch_fl, so that a `catch` there matches a type thrown from _C.
class NotAboutArguments {
 public:
  virtual ~NotAboutArguments();
};

// A c10::Error with the mark: Python sees a RuntimeError, as for TORCH_CHECK.
class ProviderError : public c10::Error, public NotAboutArguments {
 public:
  ProviderError(const c10::SourceLocation& where, std::string msg)
      : c10::Error(where, std::move(msg)) {}
};

// Rethrows `error`, raised after a provider's kernel returned (the stack holds
// its results, not the call's arguments), with the mark: marked errors and
// c10::OutOfMemoryError as they are, other c10::Errors and std::exceptions as
// a ProviderError with their message, anything else as it is.
[[noreturn]] void rethrow_not_about_arguments(std::exception_ptr error);

}  // namespace torch_fl::aten

// TORCH_CHECK's form for errors that are not about the call's arguments.
#define FLAGOS_PROVIDER_CHECK(cond, ...)                                              \
  do {                                                                                \
    if (C10_UNLIKELY(!(cond))) {                                                      \
      throw ::torch_fl::aten::ProviderError(                                          \
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, ::c10::str(__VA_ARGS__)); \
    }                                                                                 \
  } while (false)
