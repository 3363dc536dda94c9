#include "torch/tensor_util.h"

#include <c10/util/Exception.h>

namespace hcomm {

DType to_hcomm_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kChar: return DType::kInt8;
    case at::kShort: return DType::kInt16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kByte: return DType::kUInt8;
    case at::kBool: return DType::kBool;
    case at::kFloat8_e4m3fn: return DType::kFloat8E4M3;
    case at::kFloat8_e5m2: return DType::kFloat8E5M2;
    default: break;
  }
  TORCH_CHECK_VALUE(false, "hcomm: dtype ", c10::toString(type),
                    " is not supported (supported: float32, float64, float16, bfloat16, int8, int16, int32, int64, "
                    "uint8, bool, float8_e4m3fn, float8_e5m2)");
}

at::ScalarType to_torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kInt8: return at::kChar;
    case DType::kInt16: return at::kShort;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
    case DType::kUInt8: return at::kByte;
    case DType::kBool: return at::kBool;
    case DType::kFloat8E4M3: return at::kFloat8_e4m3fn;
    case DType::kFloat8E5M2: return at::kFloat8_e5m2;
    default: break;
  }
  TORCH_CHECK_VALUE(false, "hcomm: unknown dtype ", static_cast<int>(dtype));
}

ReduceOp to_hcomm_op(const c10d::ReduceOp& op, at::ScalarType type) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::BAND: return ReduceOp::kBand;
    case c10d::ReduceOp::BOR: return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR: return ReduceOp::kBxor;
    default: break;
  }
  TORCH_CHECK_VALUE(false, "hcomm: reduce op ", static_cast<int>(op.op_), " (PREMUL_SUM or unknown) is not supported for dtype ",
                    c10::toString(type), "; use sum, avg, product, min, max, band, bor or bxor");
}

std::vector<int64_t> shape_of(const at::Tensor& t) { return t.sizes().vec(); }

Buffer to_buffer(const at::Tensor& t) {
  Buffer b;
  b.data = t.data_ptr();
  b.count = t.numel();
  b.dtype = to_hcomm_dtype(t.scalar_type());
  if (t.is_cuda()) {
    b.device = DeviceKind::kCUDA;
    b.device_index = t.get_device();
  } else if (t.device().type() == at::DeviceType::PrivateUse1) {
    b.device = DeviceKind::kNPU;
    b.device_index = t.get_device();
  }
  return b;
}

static at::TensorOptions options_for(const Buffer& buf, at::ScalarType type) {
  auto opts = at::TensorOptions().dtype(type);
  if (buf.device == DeviceKind::kCUDA) opts = opts.device(at::Device(at::DeviceType::CUDA, buf.device_index));
  if (buf.device == DeviceKind::kNPU) opts = opts.device(at::Device(at::DeviceType::PrivateUse1, buf.device_index));
  return opts;
}

at::Tensor from_buffer(const Buffer& buf) {
  if (buf.count == 0 || buf.data == nullptr) return at::empty({buf.count}, options_for(buf, to_torch_dtype(buf.dtype)));
  return at::from_blob(buf.data, {buf.count}, options_for(buf, to_torch_dtype(buf.dtype)));
}

at::Tensor bytes_view(const Buffer& buf) {
  const int64_t width = static_cast<int64_t>(dtype_size(buf.dtype));
  if (buf.count == 0 || buf.data == nullptr) return at::empty({buf.count, width}, options_for(buf, at::kByte));
  return at::from_blob(buf.data, {buf.count, width}, options_for(buf, at::kByte));
}

}  // namespace hcomm
