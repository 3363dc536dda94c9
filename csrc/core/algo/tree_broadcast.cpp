// "tree": binomial-tree broadcast over point-to-point: log2(n) rounds, so
// the root's uplink carries the data log2(n) times rather than n-1.
#include "core/algo/cost.h"
#include "core/algo/registry.h"

namespace hcomm {
namespace {

class TreeBroadcast final : public Algorithm {
 public:
  const char* name() const override { return "tree"; }
  const char* description() const override { return "binomial-tree broadcast over point-to-point"; }
  bool supports(const CollectiveArgs& args, const AlgoContext&, std::string* why) const override {
    if (why) why->clear();
    return args.kind == OpKind::kBroadcast;
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    return flat_cost(args, ctx.size(), ctx.flat_link);
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override {
    Transport& t = *ctx.flat;
    const int n = t.size();
    if (n == 1 || args.input.count == 0) return;
    // Ranks renumbered so the root is 0; in round k, vrank < 2^k sends to vrank + 2^k.
    const int vrank = (t.rank() - args.root + n) % n;
    int mask = 1;
    while (mask < n) {
      if (vrank < mask) {
        int dst = vrank + mask;
        if (dst < n) {
          t.isend(args.input, (dst + args.root) % n, kAlgoTag)->wait();
          record.tiers.push_back({"flat", args.input.bytes(), 0});
        }
      } else if (vrank < 2 * mask) {
        t.irecv(args.input, (vrank - mask + args.root) % n, kAlgoTag)->wait();
      }
      mask <<= 1;
    }
  }
};

}  // namespace

const Algorithm& tree_broadcast_algorithm() {
  static const TreeBroadcast instance;
  return instance;
}

}  // namespace hcomm
