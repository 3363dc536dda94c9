#include "core/algo/cost.h"

#include <cmath>

#include "core/algo/ring.h"

namespace hcomm {

double flat_cost(const CollectiveArgs& args, int n, const LinkModel& link) {
  if (n <= 1) return 0;
  const double in = static_cast<double>(args.input.bytes());
  const double out = static_cast<double>(args.output.bytes());
  const double log_n = std::ceil(std::log2(static_cast<double>(n)));
  switch (args.kind) {
    case OpKind::kAllReduce: return 2 * ring_cost(link, n, in);
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: return ring_cost(link, n, in);
    case OpKind::kAllGather:
    case OpKind::kAllGatherV: return ring_cost(link, n, out);
    case OpKind::kBroadcast:
    case OpKind::kReduce: return log_n * link.time(in);
    case OpKind::kAllToAll:
    case OpKind::kAllToAllV: return (n - 1) * link.alpha + in * (n - 1) / n / link.beta;
    case OpKind::kGather: return (n - 1) * link.time(in);
    case OpKind::kScatter: return (n - 1) * link.time(out / std::max(n, 1));
    case OpKind::kSend:
    case OpKind::kRecv: return link.time(std::max(in, out));
    case OpKind::kBarrier: return log_n * link.alpha;
    default: return 0;
  }
}

namespace {

// A pass reads and writes the buffer once; the temporary's copy is one pass
// plus first touch of its pages, counted as a second.
constexpr double kStagingPasses = 2;
// One hand-off per ring step: fitted to the 4-rank measurement above (about
// 0.4 ms per step where 4 processes share 2 cores); on a quiet host it is
// tens of microseconds, so the term errs towards the vendor's collective.
constexpr double kHandoffSeconds = 0.4e-3;

bool rivals_gloo(const CollectiveArgs& args, const AlgoContext& ctx) {
  return (args.kind == OpKind::kAllGather || args.kind == OpKind::kReduceScatter) && ctx.flat != nullptr &&
         ctx.flat->library() == "gloo";
}

}  // namespace

double gloo_native_extra(const CollectiveArgs& args, const AlgoContext& ctx) {
  if (!rivals_gloo(args, ctx)) return 0;
  if (args.kind == OpKind::kAllGather)
    return kStagingPasses * static_cast<double>(args.output.bytes()) / ctx.reduce_bandwidth;
  const double in = static_cast<double>(args.input.bytes());
  // an all-reduce's traffic (twice the reduce-scatter's), its reduction, the copies
  return flat_cost(args, ctx.size(), ctx.flat_link) + (1 + kStagingPasses) * in / ctx.reduce_bandwidth;
}

double gloo_ring_extra(const CollectiveArgs& args, const AlgoContext& ctx) {
  // (gloo's reduce-scatter, an all-reduce's worth of steps, measured slower than the ring at every size)
  if (!rivals_gloo(args, ctx) || args.kind != OpKind::kAllGather) return 0;
  return (ctx.size() - 1) * kHandoffSeconds;
}

}  // namespace hcomm
