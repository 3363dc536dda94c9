// Portable reduction kernels for every dtype: plain loops the compiler
// vectorises for the build's baseline ISA; correct on any x86-64 or aarch64.
// reduce.cpp sends fp32/bf16/fp16 to the dispatched vector kernels and
// everything else (integers, bool, fp64) here.
#include <algorithm>
#include <type_traits>
#include <cmath>

#include "core/error.h"
#include "core/kernels/half.h"
#include "core/kernels/reduce.h"

namespace hcomm {
namespace kernels {
namespace {

template <typename T, typename F>
void apply(void* acc_v, const void* src_v, int64_t n, F f) {
  T* acc = static_cast<T*>(acc_v);
  const T* src = static_cast<const T*>(src_v);
  for (int64_t i = 0; i < n; ++i) acc[i] = f(acc[i], src[i]);
}

template <typename T>
void reduce_typed(void* acc, const void* src, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return apply<T>(acc, src, n, [](T a, T b) { return static_cast<T>(a + b); });
    case ReduceOp::kProduct: return apply<T>(acc, src, n, [](T a, T b) { return static_cast<T>(a * b); });
    // NaN propagates through min/max, as in torch.minimum/maximum.
    case ReduceOp::kMin:
      return apply<T>(acc, src, n, [](T a, T b) { return (a != a || b != b) ? static_cast<T>(a + b) : (b < a ? b : a); });
    case ReduceOp::kMax:
      return apply<T>(acc, src, n, [](T a, T b) { return (a != a || b != b) ? static_cast<T>(a + b) : (b > a ? b : a); });
    default: break;
  }
  if constexpr (std::is_integral<T>::value) {
    switch (op) {
      case ReduceOp::kBand: return apply<T>(acc, src, n, [](T a, T b) { return static_cast<T>(a & b); });
      case ReduceOp::kBor: return apply<T>(acc, src, n, [](T a, T b) { return static_cast<T>(a | b); });
      case ReduceOp::kBxor: return apply<T>(acc, src, n, [](T a, T b) { return static_cast<T>(a ^ b); });
      default: break;
    }
  }
  throw Error(ErrorKind::kInvalidArgument, std::string("reduce op ") + reduce_op_name(op) + " unsupported here");
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void reduce_half(void* acc_v, const void* src_v, int64_t n, ReduceOp op) {
  uint16_t* acc = static_cast<uint16_t*>(acc_v);
  const uint16_t* src = static_cast<const uint16_t*>(src_v);
  for (int64_t i = 0; i < n; ++i) {
    float a = ToF(acc[i]), b = ToF(src[i]), r;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: r = a + b; break;
      case ReduceOp::kProduct: r = a * b; break;
      case ReduceOp::kMin: r = (a != a || b != b) ? a + b : std::min(a, b); break;
      case ReduceOp::kMax: r = (a != a || b != b) ? a + b : std::max(a, b); break;
      default: throw Error(ErrorKind::kInvalidArgument, "bitwise reduce on a float type");
    }
    acc[i] = FromF(r);
  }
}

void reduce_bool(void* acc_v, const void* src_v, int64_t n, ReduceOp op) {
  uint8_t* acc = static_cast<uint8_t*>(acc_v);
  const uint8_t* src = static_cast<const uint8_t*>(src_v);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      for (int64_t i = 0; i < n; ++i) acc[i] = (acc[i] | src[i]) ? 1 : 0;
      return;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      for (int64_t i = 0; i < n; ++i) acc[i] = (acc[i] && src[i]) ? 1 : 0;
      return;
    case ReduceOp::kBxor:
      for (int64_t i = 0; i < n; ++i) acc[i] = ((acc[i] != 0) != (src[i] != 0)) ? 1 : 0;
      return;
    default: break;
  }
}

template <typename T>
void divide_typed(void* data_v, int64_t n, int64_t divisor) {
  T* data = static_cast<T*>(data_v);
  if constexpr (std::is_floating_point<T>::value) {
    const T d = static_cast<T>(divisor);
    for (int64_t i = 0; i < n; ++i) data[i] = data[i] / d;
  } else {
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(static_cast<int64_t>(data[i]) / divisor);
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void divide_half(void* data_v, int64_t n, int64_t divisor) {
  uint16_t* data = static_cast<uint16_t*>(data_v);
  const float d = static_cast<float>(divisor);
  for (int64_t i = 0; i < n; ++i) data[i] = FromF(ToF(data[i]) / d);
}

}  // namespace

void reduce_into_generic(void* acc, const void* src, int64_t n, DType dtype, ReduceOp op) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::kFloat32: return reduce_typed<float>(acc, src, n, op);
    case DType::kFloat64: return reduce_typed<double>(acc, src, n, op);
    case DType::kFloat16: return reduce_half<fp16_to_float, float_to_fp16>(acc, src, n, op);
    case DType::kBFloat16: return reduce_half<bf16_to_float, float_to_bf16>(acc, src, n, op);
    case DType::kInt8: return reduce_typed<int8_t>(acc, src, n, op);
    case DType::kInt16: return reduce_typed<int16_t>(acc, src, n, op);
    case DType::kInt32: return reduce_typed<int32_t>(acc, src, n, op);
    case DType::kInt64: return reduce_typed<int64_t>(acc, src, n, op);
    case DType::kUInt8: return reduce_typed<uint8_t>(acc, src, n, op);
    case DType::kBool: return reduce_bool(acc, src, n, op);
    default: break;
  }
  std::string why;
  reduce_supported(dtype, op, &why);
  throw Error(ErrorKind::kInvalidArgument, why.empty() ? "unsupported dtype for reduction" : why);
}

void divide_by(void* data, int64_t n, DType dtype, int64_t divisor) {
  if (n <= 0 || divisor == 1) return;
  switch (dtype) {
    case DType::kFloat32: return divide_typed<float>(data, n, divisor);
    case DType::kFloat64: return divide_typed<double>(data, n, divisor);
    case DType::kFloat16: return divide_half<fp16_to_float, float_to_fp16>(data, n, divisor);
    case DType::kBFloat16: return divide_half<bf16_to_float, float_to_bf16>(data, n, divisor);
    case DType::kInt8: return divide_typed<int8_t>(data, n, divisor);
    case DType::kInt16: return divide_typed<int16_t>(data, n, divisor);
    case DType::kInt32: return divide_typed<int32_t>(data, n, divisor);
    case DType::kInt64: return divide_typed<int64_t>(data, n, divisor);
    case DType::kUInt8: return divide_typed<uint8_t>(data, n, divisor);
    case DType::kBool: return;  // avg of bools is their logical or, like sum
    default: throw Error(ErrorKind::kInvalidArgument, std::string("avg is not supported for ") + dtype_name(dtype));
  }
}

}  // namespace kernels
}  // namespace hcomm
