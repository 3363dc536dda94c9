// "direct": rooted collectives (gather, scatter, reduce) as direct messages
// between the root and every rank; reduce first reduce-scatters around the
// ring so the root receives 1/n of the data from each rank instead of all.
#include <cstring>

#include "core/algo/cost.h"
#include "core/algo/registry.h"
#include "core/algo/ring.h"
#include "core/kernels/reduce.h"

namespace hcomm {
namespace {

void gather_blocks(Transport& t, const Buffer& out, const Buffer& mine, const std::vector<int64_t>& counts, int root) {
  const int n = t.size(), r = t.rank();
  const std::vector<int64_t> off = offsets_of(counts);
  if (r != root) {
    if (mine.count > 0) t.isend(mine, root, kAlgoTag)->wait();
    return;
  }
  std::vector<std::unique_ptr<Pending>> recvs;
  for (int i = 0; i < n; ++i) {
    if (counts[i] == 0) continue;
    Buffer dst = out.slice(off[i], counts[i]);
    if (i == r) {
      if (dst.data != mine.data) std::memmove(dst.data, mine.data, dst.bytes());
    } else {
      recvs.push_back(t.irecv(dst, i, kAlgoTag));
    }
  }
  for (auto& p : recvs) p->wait();
}

class DirectRooted final : public Algorithm {
 public:
  const char* name() const override { return "direct"; }
  const char* description() const override { return "gather/scatter/reduce by direct messages to and from the root"; }
  bool supports(const CollectiveArgs& args, const AlgoContext&, std::string* why) const override {
    if (args.kind == OpKind::kReduce) return reduce_supported(args.input.dtype, args.reduce, why);
    if (why) why->clear();
    return args.kind == OpKind::kGather || args.kind == OpKind::kScatter;
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    if (args.kind == OpKind::kReduce) {
      CollectiveArgs rs = args;
      rs.kind = OpKind::kReduceScatter;
      return 2 * flat_cost(rs, ctx.size(), ctx.flat_link) + args.input.bytes() / ctx.reduce_bandwidth;
    }
    return flat_cost(args, ctx.size(), ctx.flat_link);
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override {
    Transport& t = *ctx.flat;
    const int n = t.size(), r = t.rank();
    if (args.kind == OpKind::kGather) {
      gather_blocks(t, args.output, args.input, std::vector<int64_t>(n, args.input.count), args.root);
    } else if (args.kind == OpKind::kScatter) {
      const int64_t c = args.output.count;
      if (r == args.root) {
        std::vector<std::unique_ptr<Pending>> sends;
        for (int i = 0; i < n; ++i) {
          if (c == 0) break;
          if (i == r) std::memmove(args.output.data, args.input.slice(i * c, c).data, args.output.bytes());
          else sends.push_back(t.isend(args.input.slice(i * c, c), i, kAlgoTag));
        }
        for (auto& p : sends) p->wait();
      } else if (c > 0) {
        t.irecv(args.output, args.root, kAlgoTag)->wait();
      }
    } else {  // reduce, in place on input (== output)
      const std::vector<int64_t> counts = even_counts(args.input.count, n);
      ring_reduce_scatter_inplace(t, args.input, counts, args.reduce, ctx);
      Buffer mine = args.input.slice(offsets_of(counts)[r], counts[r]);
      if (args.reduce == ReduceOp::kAvg) kernels::divide_by(mine.data, mine.count, mine.dtype, n);
      gather_blocks(t, args.input, mine, counts, args.root);
    }
    record.tiers.push_back({"flat", args.payload_bytes(), 0});
  }
};

}  // namespace

const Algorithm& direct_rooted_algorithm() {
  static const DirectRooted instance;
  return instance;
}

}  // namespace hcomm
