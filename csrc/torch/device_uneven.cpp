#include "torch/device_uneven.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/op.h"
#include "core/request.h"
#include "core/validate.h"
#include "torch/tensor_util.h"
#include "torch/work.h"

namespace hcomm {
namespace {

// The checks the host path makes (core/validate.cpp), with its messages,
// plus: both tensors on one device.
void check(c10d::Backend& backend, const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
           OpKind kind, const char* op) {
  TORCH_CHECK_VALUE(input.device() == output.device(), "hcomm: ", op, " on rank ", backend.getRank(),
                    ": input is on ", input.device(), " but output is on ", output.device());
  TORCH_CHECK_VALUE(input.scalar_type() == output.scalar_type(), "hcomm: ", op, " on rank ", backend.getRank(),
                    ": input is ", input.scalar_type(), " but output is ", output.scalar_type());
  CollectiveArgs a;
  a.kind = kind;
  a.input = Buffer{nullptr, input.numel(), DType::kFloat32};
  a.output = Buffer{nullptr, output.numel(), DType::kFloat32};
  (kind == OpKind::kAllGatherV ? a.output_counts : a.input_counts) = counts;
  try {
    validate_args(a, backend.getRank(), backend.getSize());
  } catch (...) {
    rethrow_for_torch(std::current_exception());
  }
}

c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, at::Tensor output, int rank, const char* title) {
  auto request = std::make_shared<Request>();
  request->complete(nullptr, OpRecord{});
  return c10::make_intrusive<HCommWork>(std::vector<std::shared_ptr<Request>>{request}, type,
                                        std::vector<at::Tensor>{output}, std::chrono::milliseconds(0), rank, title);
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const char* op, int rank) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "hcomm: ", op, " failed on rank ", rank, " in the device library: ", e.what());
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> padded_all_gather_v(c10d::Backend& backend, at::Tensor& output, const at::Tensor& input,
                                                   const std::vector<int64_t>& counts) {
  check(backend, output, input, counts, OpKind::kAllGatherV, "all_gather_v");
  const int rank = backend.getRank(), world = backend.getSize();
  const int64_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  at::Tensor mine = at::zeros({most}, input.options());
  mine.narrow(0, 0, counts[rank]).copy_(input.reshape({-1}));
  at::Tensor gathered = at::empty({most * world}, input.options());
  if (most > 0) wait_for(backend._allgather_base(gathered, mine), "all_gather_v", rank);
  at::Tensor flat = output.view({-1});
  int64_t at_ = 0;
  for (int q = 0; q < world; ++q) {
    flat.narrow(0, at_, counts[q]).copy_(gathered.narrow(0, static_cast<int64_t>(q) * most, counts[q]));
    at_ += counts[q];
  }
  return done(c10d::OpType::ALLGATHER, output, rank, "hcomm:all_gather_v");
}

c10::intrusive_ptr<c10d::Work> padded_reduce_scatter_v(c10d::Backend& backend, at::Tensor& output,
                                                       const at::Tensor& input, const std::vector<int64_t>& counts,
                                                       const c10d::ReduceOp& op) {
  check(backend, output, input, counts, OpKind::kReduceScatterV, "reduce_scatter_v");
  const int rank = backend.getRank(), world = backend.getSize();
  const int64_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  // Padding is zeros: reduced with anything it stays in the padding, which is dropped.
  at::Tensor padded = at::zeros({most * world}, input.options());
  at::Tensor flat = input.reshape({-1});
  int64_t at_ = 0;
  for (int q = 0; q < world; ++q) {
    padded.narrow(0, static_cast<int64_t>(q) * most, counts[q]).copy_(flat.narrow(0, at_, counts[q]));
    at_ += counts[q];
  }
  at::Tensor mine = at::empty({most}, input.options());
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = op;
  if (most > 0) wait_for(backend._reduce_scatter_base(mine, padded, opts), "reduce_scatter_v", rank);
  output.view({-1}).copy_(mine.narrow(0, 0, counts[rank]));
  return done(c10d::OpType::REDUCE_SCATTER, output, rank, "hcomm:reduce_scatter_v");
}

}  // namespace hcomm
