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

}  // namespace hcomm
