// C++17 kernel for the CPU backend: OpenMP threads + SIMD, exported with extern "C".
#include <cstdint>

extern "C" void axpby(const float* __restrict a, const float* __restrict b, float* __restrict out,
                      float alpha, float beta, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    out[i] = alpha * a[i] + beta * b[i];
  }
}
