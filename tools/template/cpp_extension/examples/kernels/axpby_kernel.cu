// Raw CUDA: the kernel and an extern "C" launcher. No torch headers in .cu files.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void axpby_kernel(const float* __restrict__ a, const float* __restrict__ b,
                             float* __restrict__ out, float alpha, float beta, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) {
    out[i] = alpha * a[i] + beta * b[i];
  }
}

// Returns the launch error (0 = cudaSuccess) so the binding can report it.
extern "C" int launch_axpby(const float* a, const float* b, float* out, float alpha, float beta,
                            int64_t n) {
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  axpby_kernel<<<(unsigned)blocks, threads>>>(a, b, out, alpha, beta, n);
  return (int)cudaGetLastError();
}
