// Alpha-beta cost formulas shared by the flat algorithms (Thakur, Rabenseifner
// and Gropp's models; the same bus factors nccl-tests reports).
#pragma once

#include "core/algo/algorithm.h"

namespace hcomm {

// Predicted seconds for a flat collective of `args` on `n` ranks over `link`,
// by the algorithm shape named: ring for all_reduce/reduce_scatter/all_gather,
// binomial tree for broadcast/reduce, pairwise for all_to_all, linear for
// gather/scatter.
double flat_cost(const CollectiveArgs& args, int n, const LinkModel& link);

}  // namespace hcomm
