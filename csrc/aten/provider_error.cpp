#include "aten/provider_error.h"

namespace torch_fl::aten {

NotAboutArguments::~NotAboutArguments() = default;

}  // namespace torch_fl::aten
