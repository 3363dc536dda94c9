// Launch geometry and error checks shared by the CUDA kernels.
#include <mutex>

#include "core/kernels/cuda/common.cuh"

namespace hcomm {
namespace kernels {
namespace cuda {

namespace {
// SM count per device, read once: cudaDeviceGetAttribute is cheap but not
// free, and the kernels are launched per collective chunk.
constexpr int kMaxDevices = 64;
int g_sms[kMaxDevices] = {};
std::mutex g_mu;

int sm_count() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 80;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_sms[dev] == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 80;
    g_sms[dev] = sms;
  }
  return g_sms[dev];
}
}  // namespace

int grid_for(int64_t work, int per_block, int blocks_per_sm) {
  const int64_t need = (work + per_block - 1) / per_block;
  // 8 resident blocks of 256 threads fill an SM (2048 threads); beyond that
  // the grid-stride loop gives each thread more packs, which keeps several
  // loads in flight without paying for extra blocks.
  const int64_t cap = static_cast<int64_t>(sm_count()) * blocks_per_sm;
  return static_cast<int>(need < 1 ? 1 : (need < cap ? need : cap));
}

void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(ErrorKind::kRuntime, std::string(what) + ": CUDA launch failed: " + cudaGetErrorString(err));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace hcomm
