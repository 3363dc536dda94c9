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

// What the alpha-beta terms miss when gloo's own all_gather_into_tensor /
// reduce_scatter_tensor ("native") compete with hcomm's rings over gloo's
// point-to-point on one flat group.  Measured side by side on one group
// (benchmarks/overhead/bench_flat_choice.py, 2 and 4 local ranks, 2026-12-06):
// the vendor's all-gather copies through a temporary per call (1.3-1.4x the
// ring at 8 MiB, 2.5-3x at 32 MiB, past glibc's mmap threshold where every
// call faults in fresh pages); its reduce-scatter costs about an all-reduce
// of the whole buffer (the ring faster at every size, 0.5-0.85x); and each
// step of an all-gather ring driven from hcomm's worker pays a hand-off to
// gloo's IO thread that gloo's own ring does not (the ring 1.15-1.6x native
// at 64 KiB-1 MiB on 4 ranks).  Zero for other libraries and collectives
// (the _v forms have no vendor rival; gloo's all_reduce, in place, measured
// as fast as hcomm's ring or faster).
double gloo_native_extra(const CollectiveArgs& args, const AlgoContext& ctx);
double gloo_ring_extra(const CollectiveArgs& args, const AlgoContext& ctx);

}  // namespace hcomm
