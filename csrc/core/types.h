// Element types, reduction ops and the raw buffer view the core works on.
// No torch or Python headers here: the core is tested with thread ranks and
// reused by vendor adapters that know nothing of torch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace hcomm {

enum class DType : int {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  kFloat8E4M3,  // OCP FP8 e4m3fn: no inf, one NaN pattern, saturates at 448
  kFloat8E5M2,  // OCP FP8 e5m2: IEEE-like, inf and NaN
  kCount
};

enum class ReduceOp : int { kSum = 0, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor, kCount };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* reduce_op_name(ReduceOp op);
bool is_floating(DType dtype);
bool is_integral(DType dtype);  // bool counts as integral
// Whether the core's reduction kernels can apply `op` to `dtype`; `why`
// receives a message naming both when they cannot.
bool reduce_supported(DType dtype, ReduceOp op, std::string* why = nullptr);

// A contiguous range of `count` elements of `dtype` at `data`.  Device
// buffers carry the device kind so adapters can pick host staging.
enum class DeviceKind : int { kCPU = 0, kCUDA, kNPU };

struct Buffer {
  void* data = nullptr;
  int64_t count = 0;
  DType dtype = DType::kFloat32;
  DeviceKind device = DeviceKind::kCPU;
  int device_index = -1;

  size_t bytes() const { return static_cast<size_t>(count) * dtype_size(dtype); }
  // The sub-range [offset, offset + n) in elements.
  Buffer slice(int64_t offset, int64_t n) const {
    Buffer b = *this;
    b.data = static_cast<char*>(data) + static_cast<size_t>(offset) * dtype_size(dtype);
    b.count = n;
    return b;
  }
};

}  // namespace hcomm
