// "ring": reduce-scatter then all-gather around a ring of point-to-point
// messages, reducing with hcomm's own kernels.  Runs any dtype/op the core
// reduces (int16, bool bitwise ops, avg of integers) on any transport that
// can send bytes; every rank ends with bitwise-identical results because
// each block is reduced once, by its owner, and then copied.
#include <cstring>

#include "core/algo/cost.h"
#include "core/algo/registry.h"
#include "core/algo/ring.h"
#include "core/kernels/reduce.h"

namespace hcomm {
namespace {

class RingAllReduce final : public Algorithm {
 public:
  const char* name() const override { return "ring"; }
  const char* description() const override {
    return "ring reduce-scatter + all-gather over point-to-point, hcomm's own reduction kernels";
  }
  bool supports(const CollectiveArgs& args, const AlgoContext&, std::string* why) const override {
    if (args.kind != OpKind::kAllReduce) {
      if (why) why->clear();
      return false;
    }
    return reduce_supported(args.input.dtype, args.reduce, why);
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    const double bytes = static_cast<double>(args.input.bytes());
    return flat_cost(args, ctx.size(), ctx.flat_link) + bytes / ctx.reduce_bandwidth;
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override {
    Transport& t = *ctx.flat;
    const int n = t.size(), r = t.rank();
    const std::vector<int64_t> counts = even_counts(args.input.count, n);
    ring_reduce_scatter_inplace(t, args.input, counts, args.reduce, ctx);
    if (args.reduce == ReduceOp::kAvg)
      kernels::divide_by(args.input.slice(offsets_of(counts)[r], 0).data, counts[r], args.input.dtype, n);
    ring_all_gather_inplace(t, args.input, counts);
    record.tiers.push_back({"flat", 2 * args.input.bytes() * static_cast<size_t>(n - 1) / std::max(n, 1), 0});
  }
};

}  // namespace

const Algorithm& ring_all_reduce_algorithm() {
  static const RingAllReduce instance;
  return instance;
}

}  // namespace hcomm
