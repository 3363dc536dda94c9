// Uneven all-gather and reduce-scatter on a device library that has only
// even ones (NCCL's allgather and reduce_scatter take one count for all
// ranks): every rank's block is padded to the largest count, the library's
// even collective runs on device memory, and the blocks are compacted.  It
// moves max(counts) x ranks elements instead of the sum, which is what FSDP
// pays for uneven shards too; in exchange the data never leaves the device.
//
// Stream semantics are the library's: the padding copies run on the caller's
// current stream, the collective is ordered after them, and its wait() makes
// the current stream wait before the compacting copies; the returned Work is
// complete for the host (the compacted output is ordered on the stream).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <vector>

namespace hcomm {

c10::intrusive_ptr<c10d::Work> padded_all_gather_v(c10d::Backend& backend, at::Tensor& output, const at::Tensor& input,
                                                   const std::vector<int64_t>& counts);
c10::intrusive_ptr<c10d::Work> padded_reduce_scatter_v(c10d::Backend& backend, at::Tensor& output,
                                                       const at::Tensor& input, const std::vector<int64_t>& counts,
                                                       const c10d::ReduceOp& op);

}  // namespace hcomm
