// "hier_rs": hierarchical reduce-scatter (equal and `_v` counts), the ZeRO
// and FSDP gradient path.
//
// Inside each island, reduce-scatter every island's range: the own range by
// its members' blocks, every other island's range by this island's
// partition of it.  Then each rank sends its island-partial pieces straight
// to the owners of the overlapping blocks, which add the islands' partials
// in island order.  Every byte crosses the slow tier once.
#include <cstring>

#include "core/algo/cost.h"
#include "core/algo/hier.h"
#include "core/algo/registry.h"
#include "core/algo/ring.h"
#include "core/kernels/reduce.h"
#include "core/stage/bridge.h"

namespace hcomm {
namespace {

class HierReduceScatter final : public Algorithm {
 public:
  const char* name() const override { return "hier_rs"; }
  const char* description() const override {
    return "hierarchical reduce-scatter: intra-island reduce-scatters, partials cross islands once by overlap";
  }
  bool supports(const CollectiveArgs& a, const AlgoContext& ctx, std::string* why) const override {
    return hier_applies(a, ctx, {OpKind::kReduceScatter, OpKind::kReduceScatterV}, true, why) &&
           reduce_supported(a.input.dtype, a.reduce, why);
  }
  double cost(const CollectiveArgs& a, const AlgoContext& ctx) const override {
    const Hierarchy& h = *ctx.hierarchy;
    const double total = static_cast<double>(a.input.bytes());
    double t = 0;
    for (size_t i = 0; i < h.count(); ++i) {
      const double others = total * (1.0 - static_cast<double>(h.islands[i].size()) / ctx.size());
      const int sharing = h.uplink_sharing.empty() ? 1 : h.uplink_sharing[i];
      const double out = others * sharing / h.islands[i].size();
      t = std::max(t, h.inter_link.time(out, h.count() - 1) + ring_cost(h.intra_link, h.islands[i].size(), total));
    }
    return t + total / ctx.reduce_bandwidth;
  }
  void run(const CollectiveArgs& a, AlgoContext& ctx, OpRecord& record) const override {
    const Hierarchy& h = *ctx.hierarchy;
    Transport& flat = *ctx.flat;
    const int n = flat.size(), rank = flat.rank(), me = h.island_of[rank], local = h.local_index[rank];
    std::vector<int64_t> counts = a.input_counts;
    if (counts.empty()) counts.assign(n, a.output.count);
    const std::vector<int64_t> off = offsets_of(counts);
    const size_t esize = dtype_size(a.input.dtype);
    // Work on a copy: the caller's input stays as it was.  (On a device it
    // would be device scratch; under the staging mode it stands for one, and
    // only the bridge and the engine move its bytes to and from the host.)
    stage::CopyEngine* engine = staging_engine(h, a.input);
    std::vector<uint8_t> own_copy;
    uint8_t* copy = ctx.copy_bytes(a.input.bytes(), own_copy);
    if (a.input.bytes()) std::memcpy(copy, a.input.data, a.input.bytes());
    Buffer work = a.input;
    work.data = copy;
    // Phase 1: intra-island reduce-scatters.
    std::vector<Range> my_piece(h.count());
    for (size_t j = 0; j < h.count(); ++j) {
      Range r = island_range(h, static_cast<int>(j), off);
      std::vector<int64_t> lc;
      if (static_cast<int>(j) == me) {
        for (int m : h.islands[me]) lc.push_back(counts[m]);
        my_piece[j] = Range{off[rank], off[rank + 1]};
      } else {
        auto parts = island_partition(h, me, r);
        for (const Range& p : parts) lc.push_back(p.size());
        my_piece[j] = parts[local];
      }
      ring_reduce_scatter_inplace_tagged(*h.intra, work.slice(r.begin, r.size()), lc, a.reduce, ctx, kTagIntraRS);
    }
    // Phase 2: partials to the block owners; my block's partials from every island.
    const Range block{off[rank], off[rank + 1]};
    const size_t block_bytes = static_cast<size_t>(block.size()) * esize;
    std::vector<uint8_t> partials(block_bytes * h.count());
    stage::Bridge bridge(flat, engine, h.bridge_chunk_bytes, kTagInter);
    size_t inter_bytes = 0;
    for (size_t j = 0; j < h.count(); ++j) {
      if (static_cast<int>(j) == me) continue;
      for (int owner : h.islands[j]) {
        Range o = overlap(my_piece[j], Range{off[owner], off[owner + 1]});
        if (o.size() == 0) continue;
        bridge.send(work.slice(o.begin, o.size()), owner);
        inter_bytes += static_cast<size_t>(o.size()) * esize;
      }
      auto parts = island_partition(h, static_cast<int>(j), island_range(h, me, off));
      for (size_t q = 0; q < parts.size(); ++q) {
        Range o = overlap(block, parts[q]);
        if (o.size() == 0) continue;
        Buffer dst = work;
        dst.data = partials.data() + j * block_bytes + static_cast<size_t>(o.begin - block.begin) * esize;
        dst.count = o.size();
        dst.device = DeviceKind::kCPU;
        bridge.recv(dst, h.islands[j][q], /*device_memory=*/false);
      }
    }
    // My own partial joins the others on the host (a copy up when staged).
    stage::Ticket own;
    if (block.size() > 0 && engine)
      own = engine->to_host(partials.data() + me * block_bytes, work.slice(block.begin, 0).data, block_bytes);
    else if (block.size() > 0)
      std::memcpy(partials.data() + me * block_bytes, work.slice(block.begin, 0).data, block_bytes);
    try {
      bridge.finish();
    } catch (...) {
      if (engine) engine->wait(own);  // it writes into `partials`
      throw;
    }
    if (engine) engine->wait(own);
    // Island order, so the result does not depend on which island owns the block.
    for (size_t j = 1; j < h.count(); ++j)
      kernels::reduce_into(partials.data(), partials.data() + j * block_bytes, block.size(), a.input.dtype, a.reduce);
    if (a.reduce == ReduceOp::kAvg) kernels::divide_by(partials.data(), block.size(), a.input.dtype, n);
    if (block_bytes && engine)
      engine->wait(engine->to_device(a.output.data, partials.data(), block_bytes));
    else if (block_bytes)
      std::memcpy(a.output.data, partials.data(), block_bytes);
    record.staged_bytes = bridge.staged_bytes() + (engine ? 2 * block_bytes : 0);
    record.tiers.push_back({"intra", a.input.bytes() - block_bytes, 0});
    record.tiers.push_back({"inter", inter_bytes, 0});
  }
};

}  // namespace

const Algorithm& hier_reduce_scatter_algorithm() {
  static const HierReduceScatter instance;
  return instance;
}

}  // namespace hcomm
