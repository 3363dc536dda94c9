// "ring_ag": ring all-gather over point-to-point, equal or uneven counts.
#include <cstring>

#include "core/algo/cost.h"
#include "core/algo/registry.h"
#include "core/algo/ring.h"

namespace hcomm {
namespace {

class RingAllGather final : public Algorithm {
 public:
  const char* name() const override { return "ring_ag"; }
  const char* description() const override { return "ring all-gather (equal or uneven counts)"; }
  bool supports(const CollectiveArgs& args, const AlgoContext&, std::string* why) const override {
    if (why) why->clear();
    return args.kind == OpKind::kAllGather || args.kind == OpKind::kAllGatherV;
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    return flat_cost(args, ctx.size(), ctx.flat_link) + gloo_ring_extra(args, ctx);
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override {
    Transport& t = *ctx.flat;
    const int n = t.size(), r = t.rank();
    std::vector<int64_t> counts = args.output_counts;
    if (counts.empty()) counts.assign(n, args.input.count);
    Buffer mine = args.output.slice(offsets_of(counts)[r], counts[r]);
    if (mine.count > 0 && mine.data != args.input.data) std::memmove(mine.data, args.input.data, mine.bytes());
    ring_all_gather_inplace(t, args.output, counts);
    record.tiers.push_back({"flat", mine.bytes() * static_cast<size_t>(n - 1), 0});
  }
};

}  // namespace

const Algorithm& ring_all_gather_algorithm() {
  static const RingAllGather instance;
  return instance;
}

}  // namespace hcomm
