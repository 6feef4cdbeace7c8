#include "aten/provider_error.h"

#include "aten/call_copy.h"

namespace torch_fl::aten {

NotAboutArguments::~NotAboutArguments() = default;

void rethrow_not_about_arguments(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const NotAboutArguments&) {
    throw;
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::exception& e) {
    FLAGOS_PROVIDER_CHECK(false, error_text(e));
  }
}

}  // namespace torch_fl::aten
