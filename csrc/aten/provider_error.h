#pragma once

// Errors of a provider (FlagGems' kernels) that are not about the call's
// arguments: a launch that failed, a plan that verification refused, memory,
// an interrupt. The boxed kernel raises them as they are; any other error of
// a FlagGems call has the native kernel check the call's arguments first
// (fallback.cpp, check_natively).

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

}  // namespace torch_fl::aten

// TORCH_CHECK's form for errors that are not about the call's arguments.
#define FLAGOS_PROVIDER_CHECK(cond, ...)                                               \
  do {                                                                                 \
    if (C10_UNLIKELY(!(cond))) {                                                       \
      throw ::torch_fl::aten::ProviderError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, \
                                            ::c10::str(__VA_ARGS__));                   \
    }                                                                                  \
  } while (false)
