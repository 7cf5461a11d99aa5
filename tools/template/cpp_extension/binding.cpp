// The extension module (read-only): applies every REGISTER_BINDING of kernels/*_binding.cpp.
#include "binding_registry.h"

PYBIND11_MODULE(cuda_extension, m) {
  for (auto& entry : cuda_agent::binding_registry()) {
    entry.second(m);
  }
}
