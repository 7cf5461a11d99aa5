// Binding registry (read-only). Each kernels/<name>_binding.cpp registers its Python
// functions with REGISTER_BINDING; binding.cpp puts them all in one module,
// `cuda_extension`, which model_new.py gets from load_kernels().
#pragma once

// The tensor API (torch::Tensor, torch::empty, TORCH_CHECK, ...) and pybind11 with torch's
// type casters. This is all a binding needs; <torch/extension.h> works too but compiles slower.
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>
#include <vector>

namespace cuda_agent {

using BindingFn = void (*)(pybind11::module_&);

inline std::vector<std::pair<const char*, BindingFn>>& binding_registry() {
  static std::vector<std::pair<const char*, BindingFn>> registry;
  return registry;
}

struct BindingRegistrar {
  BindingRegistrar(const char* name, BindingFn fn) { binding_registry().emplace_back(name, fn); }
};

}  // namespace cuda_agent

// REGISTER_BINDING(axpby, register_axpby);  with  void register_axpby(pybind11::module_& m)
#define REGISTER_BINDING(name, fn) \
  static ::cuda_agent::BindingRegistrar cuda_agent_binding_##name(#name, fn)
