// "pairwise": all-to-all in n-1 rounds; in round s rank r sends to r+s and
// receives from r-s, so every link carries one message per round.
#include <cstring>

#include "core/algo/cost.h"
#include "core/algo/registry.h"

namespace hcomm {
namespace {

class PairwiseAllToAll final : public Algorithm {
 public:
  const char* name() const override { return "pairwise"; }
  const char* description() const override { return "pairwise-exchange all-to-all (equal or uneven splits)"; }
  bool supports(const CollectiveArgs& args, const AlgoContext&, std::string* why) const override {
    if (why) why->clear();
    return args.kind == OpKind::kAllToAll || args.kind == OpKind::kAllToAllV;
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    return flat_cost(args, ctx.size(), ctx.flat_link);
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override {
    Transport& t = *ctx.flat;
    const int n = t.size(), r = t.rank();
    std::vector<int64_t> sc = args.input_counts, rc = args.output_counts;
    if (sc.empty()) sc.assign(n, args.input.count / n);
    if (rc.empty()) rc.assign(n, args.output.count / n);
    const std::vector<int64_t> so = offsets_of(sc), ro = offsets_of(rc);
    if (rc[r] > 0) std::memmove(args.output.slice(ro[r], 0).data, args.input.slice(so[r], 0).data, rc[r] * dtype_size(args.input.dtype));
    size_t sent = 0;
    for (int s = 1; s < n; ++s) {
      const int to = (r + s) % n, from = (r - s + n) % n;
      std::unique_ptr<Pending> recv, send;
      if (rc[from] > 0) recv = t.irecv(args.output.slice(ro[from], rc[from]), from, kAlgoTag);
      if (sc[to] > 0) send = t.isend(args.input.slice(so[to], sc[to]), to, kAlgoTag);
      if (recv) recv->wait();
      if (send) send->wait();
      sent += sc[to] * dtype_size(args.input.dtype);
    }
    record.tiers.push_back({"flat", sent, 0});
  }
};

}  // namespace

const Algorithm& pairwise_all_to_all_algorithm() {
  static const PairwiseAllToAll instance;
  return instance;
}

}  // namespace hcomm
