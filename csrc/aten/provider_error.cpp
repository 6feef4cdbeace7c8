#include "aten/provider_error.h"

namespace torch_fl::aten {

NotAboutArguments::~NotAboutArguments() = default;

void rethrow_not_about_arguments(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const NotAboutArguments&) {
    throw;
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error& e) {
    FLAGOS_PROVIDER_CHECK(false, e.what_without_backtrace());
  } catch (const std::exception& e) {
    FLAGOS_PROVIDER_CHECK(false, e.what());
  }
}

}  // namespace torch_fl::aten
