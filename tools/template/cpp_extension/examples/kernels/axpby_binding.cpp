// Tensor checks and the Python binding. Registered in the cuda_extension module
// through the fixed registry (binding_registry.h, binding.cpp).
#include "binding_registry.h"

extern "C" int launch_axpby(const float* a, const float* b, float* out, float alpha, float beta,
                            int64_t n);

torch::Tensor axpby_forward(torch::Tensor a, torch::Tensor b, double alpha, double beta) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), "axpby: inputs must be CUDA tensors");
  TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32,
              "axpby: inputs must be float32");
  TORCH_CHECK(a.sizes() == b.sizes(), "axpby: shapes differ");
  a = a.contiguous();
  b = b.contiguous();
  auto out = torch::empty_like(a);
  int err = launch_axpby(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(),
                         (float)alpha, (float)beta, a.numel());
  TORCH_CHECK(err == 0, "axpby: kernel launch failed with CUDA error ", err);
  return out;
}

void register_axpby(pybind11::module_& m) {
  m.def("axpby_forward", &axpby_forward, "out = alpha * a + beta * b", pybind11::arg("a"),
        pybind11::arg("b"), pybind11::arg("alpha"), pybind11::arg("beta"));
}

REGISTER_BINDING(axpby, register_axpby);
