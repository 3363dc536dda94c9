// Ring building blocks over point-to-point messages, for any dtype the
// core's kernels reduce and any per-rank counts (the uneven `_v` forms).
// Used by the ring algorithms and, per tier, by the hierarchical ones.
#pragma once

#include <vector>

#include "core/algo/algorithm.h"

namespace hcomm {

// `work` holds this rank's full input (sum of counts elements).  Afterwards
// work's block `rank` (at offsets[rank]) holds the reduction of that block
// over all ranks; other blocks hold partial sums.  Avg is left as a sum.
void ring_reduce_scatter_inplace(Transport& t, const Buffer& work, const std::vector<int64_t>& counts,
                                 ReduceOp op, AlgoContext& ctx);

// `out` holds this rank's block at offsets[rank]; afterwards every block.
void ring_all_gather_inplace(Transport& t, const Buffer& out, const std::vector<int64_t>& counts);

// The same with an explicit message tag, for stages that run concurrently.
void ring_reduce_scatter_inplace_tagged(Transport& t, const Buffer& work, const std::vector<int64_t>& counts,
                                        ReduceOp op, AlgoContext& ctx, int tag);
void ring_all_gather_inplace_tagged(Transport& t, const Buffer& out, const std::vector<int64_t>& counts, int tag);

// Ring cost terms: (n-1) steps moving `bytes_per_step` each.
double ring_cost(const LinkModel& link, int n, double total_bytes);

}  // namespace hcomm
