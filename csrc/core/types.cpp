#include "core/types.h"

namespace hcomm {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16: return 2;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return 1;
    default: return 0;
  }
}

const char* dtype_name(DType dtype) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16", "int8", "int16",
                                "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2"};
  int i = static_cast<int>(dtype);
  return (i >= 0 && i < static_cast<int>(DType::kCount)) ? names[i] : "unknown-dtype";
}

const char* reduce_op_name(ReduceOp op) {
  static const char* names[] = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor"};
  int i = static_cast<int>(op);
  return (i >= 0 && i < static_cast<int>(ReduceOp::kCount)) ? names[i] : "unknown-op";
}

bool is_floating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16 ||
         d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2;
}

bool is_integral(DType d) {
  return d == DType::kInt8 || d == DType::kInt16 || d == DType::kInt32 || d == DType::kInt64 ||
         d == DType::kUInt8 || d == DType::kBool;
}

bool reduce_supported(DType dtype, ReduceOp op, std::string* why) {
  auto fail = [&](const char* reason) {
    if (why) *why = std::string("reduce op ") + reduce_op_name(op) + " is not supported for dtype " +
                    dtype_name(dtype) + ": " + reason;
    return false;
  };
  if (dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2)
    return fail("fp8 is a wire format; reduce in a wider type and compress the weak tier instead");
  bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (bitwise && !is_integral(dtype)) return fail("bitwise ops need an integer or bool dtype");
  if (static_cast<int>(op) < 0 || op >= ReduceOp::kCount) return fail("unknown op");
  return true;
}

}  // namespace hcomm
