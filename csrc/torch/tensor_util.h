// Conversions between torch's types and the core's.  Only csrc/torch/
// includes torch headers.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "core/communicator.h"
#include "core/types.h"

namespace hcomm {

// Throws c10::TypeError-style ValueError naming the dtype when unsupported.
DType to_hcomm_dtype(at::ScalarType type);
at::ScalarType to_torch_dtype(DType dtype);
ReduceOp to_hcomm_op(const c10d::ReduceOp& op, at::ScalarType type);

// t's sizes, for CollectiveArgs::shape (HCOMM_DEBUG).
std::vector<int64_t> shape_of(const at::Tensor& t);
// A view of a contiguous tensor as a core Buffer.
Buffer to_buffer(const at::Tensor& t);
// A tensor aliasing `buf` (no copy), for handing core buffers to c10d.
at::Tensor from_buffer(const Buffer& buf);
// The same bytes as a 2-D uint8 tensor [count, element size]: lets a library
// move any dtype (int16, fp8) for ops that do not reduce.
at::Tensor bytes_view(const Buffer& buf);

// Runs a collective's argument checks; a failure is reported to the
// communicator first (Communicator::reject), so that under HCOMM_DEBUG the
// other ranks, whose calls were fine, raise at once instead of waiting out
// the timeout for a rank that will not come.
template <typename F>
void checked(Communicator& comm, OpKind kind, F&& checks) {
  try {
    checks();
  } catch (const c10::Error& e) {
    CollectiveArgs a;
    a.kind = kind;
    comm.reject(a, e.msg());
    throw;
  }
}

}  // namespace hcomm
