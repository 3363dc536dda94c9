// "native": the vendor library's own collective (gloo's ring, NCCL's
// ring/tree, HCCL's), used whenever the library supports the call.
#include "core/algo/cost.h"
#include "core/algo/registry.h"

namespace hcomm {
namespace {

class Native final : public Algorithm {
 public:
  const char* name() const override { return "native"; }
  const char* description() const override { return "the vendor library's own collective"; }
  bool supports(const CollectiveArgs& args, const AlgoContext& ctx, std::string* why) const override {
    if (ctx.flat->supports(args)) return true;
    if (why) *why = ctx.flat->library() + " has no native " + args.describe();
    return false;
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    return flat_cost(args, ctx.size(), ctx.flat_link) + gloo_native_extra(args, ctx);
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override {
    ctx.flat->run(args);
    record.tiers.push_back({"flat", args.payload_bytes(), 0});
  }
};

}  // namespace

const Algorithm& native_algorithm() {
  static const Native instance;
  return instance;
}

}  // namespace hcomm
