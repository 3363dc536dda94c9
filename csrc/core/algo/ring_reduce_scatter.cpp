// "ring_rs": ring reduce-scatter over point-to-point with hcomm's kernels,
// for equal and uneven (`_v`) counts and any dtype the core reduces.
#include <cstring>

#include "core/algo/cost.h"
#include "core/algo/registry.h"
#include "core/algo/ring.h"
#include "core/kernels/reduce.h"

namespace hcomm {
namespace {

// Uneven reduce-scatter: input holds sum(counts); rank r's block lands in output.
class RingReduceScatter final : public Algorithm {
 public:
  const char* name() const override { return "ring_rs"; }
  const char* description() const override { return "ring reduce-scatter (equal or uneven counts)"; }
  bool supports(const CollectiveArgs& args, const AlgoContext&, std::string* why) const override {
    if (args.kind != OpKind::kReduceScatter && args.kind != OpKind::kReduceScatterV) {
      if (why) why->clear();
      return false;
    }
    return reduce_supported(args.input.dtype, args.reduce, why);
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    return flat_cost(args, ctx.size(), ctx.flat_link) + args.input.bytes() / ctx.reduce_bandwidth;
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override {
    Transport& t = *ctx.flat;
    const int n = t.size(), r = t.rank();
    std::vector<int64_t> counts = args.input_counts;
    if (counts.empty()) counts.assign(n, args.output.count);
    // Reduce in a copy so the caller's input stays untouched.
    std::vector<uint8_t> own_copy;
    uint8_t* copy = ctx.copy_bytes(args.input.bytes(), own_copy);
    if (args.input.bytes()) std::memcpy(copy, args.input.data, args.input.bytes());
    Buffer work = args.input;
    work.data = copy;
    ring_reduce_scatter_inplace(t, work, counts, args.reduce, ctx);
    Buffer mine = work.slice(offsets_of(counts)[r], counts[r]);
    if (args.reduce == ReduceOp::kAvg) kernels::divide_by(mine.data, mine.count, mine.dtype, n);
    if (mine.count > 0) std::memcpy(args.output.data, mine.data, mine.bytes());
    record.tiers.push_back({"flat", args.input.bytes() - mine.bytes(), 0});
  }
};

}  // namespace

const Algorithm& ring_reduce_scatter_algorithm() {
  static const RingReduceScatter instance;
  return instance;
}

}  // namespace hcomm
