// "dissemination": barrier in ceil(log2 n) rounds of one-byte messages
// (Hensgen, Finkel and Manber), for transports without a native barrier.
#include "core/algo/cost.h"
#include "core/algo/registry.h"

namespace hcomm {
namespace {

class DisseminationBarrier final : public Algorithm {
 public:
  const char* name() const override { return "dissemination"; }
  const char* description() const override { return "dissemination barrier over point-to-point"; }
  bool supports(const CollectiveArgs& args, const AlgoContext&, std::string* why) const override {
    if (why) why->clear();
    return args.kind == OpKind::kBarrier;
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    return flat_cost(args, ctx.size(), ctx.flat_link);
  }
  void run(const CollectiveArgs&, AlgoContext& ctx, OpRecord&) const override {
    Transport& t = *ctx.flat;
    const int n = t.size(), r = t.rank();
    uint8_t out = 1, in = 0;
    Buffer sbuf{&out, 1, DType::kUInt8}, rbuf{&in, 1, DType::kUInt8};
    for (int k = 1; k < n; k <<= 1) {
      auto recv = t.irecv(rbuf, (r - k + n) % n, kAlgoTag);
      auto send = t.isend(sbuf, (r + k) % n, kAlgoTag);
      recv->wait();
      send->wait();
    }
  }
};

}  // namespace

const Algorithm& dissemination_barrier_algorithm() {
  static const DisseminationBarrier instance;
  return instance;
}

}  // namespace hcomm
