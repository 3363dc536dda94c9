// "hier_ag": hierarchical all-gather (equal and `_v` counts).
//
// Each rank sends its own block straight to the ranks of every other island
// that own the overlapping part of that island's partition of the block's
// island range; each island then all-gathers, inside itself, every other
// island's range and its own.  Every byte crosses the slow tier once per
// destination island, whatever the island sizes.
#include <cstring>

#include "core/algo/cost.h"
#include "core/algo/hier.h"
#include "core/algo/registry.h"
#include "core/stage/bridge.h"
#include "core/algo/ring.h"

namespace hcomm {
namespace {

class HierAllGather final : public Algorithm {
 public:
  const char* name() const override { return "hier_ag"; }
  const char* description() const override {
    return "hierarchical all-gather: blocks cross islands once by overlap, then intra-island all-gathers";
  }
  bool supports(const CollectiveArgs& a, const AlgoContext& ctx, std::string* why) const override {
    return hier_applies(a, ctx, {OpKind::kAllGather, OpKind::kAllGatherV}, true, why);
  }
  double cost(const CollectiveArgs& a, const AlgoContext& ctx) const override {
    const Hierarchy& h = *ctx.hierarchy;
    const double total = static_cast<double>(a.output.bytes());
    double t = 0;
    for (size_t i = 0; i < h.count(); ++i) {
      const double island_bytes = total * h.islands[i].size() / ctx.size();
      const int sharing = h.uplink_sharing.empty() ? 1 : h.uplink_sharing[i];
      const double out = island_bytes * (h.count() - 1) * sharing / h.islands[i].size();
      t = std::max(t, h.inter_link.time(out, h.count() - 1) + ring_cost(h.intra_link, h.islands[i].size(), total));
    }
    return t;
  }
  void run(const CollectiveArgs& a, AlgoContext& ctx, OpRecord& record) const override {
    const Hierarchy& h = *ctx.hierarchy;
    Transport& flat = *ctx.flat;
    const int n = flat.size(), rank = flat.rank(), me = h.island_of[rank];
    std::vector<int64_t> counts = a.output_counts;
    if (counts.empty()) counts.assign(n, a.input.count);
    const std::vector<int64_t> off = offsets_of(counts);
    const Buffer out = a.output;
    const Range my_block{off[rank], off[rank + 1]};
    if (my_block.size() > 0 && out.slice(my_block.begin, 0).data != a.input.data)
      std::memmove(out.slice(my_block.begin, 0).data, a.input.data, a.input.bytes());
    // Phase 1: across islands, by overlap (host-staged when `out` is device memory).
    stage::Bridge bridge(flat, staging_engine(h, out), h.bridge_chunk_bytes, kTagInter);
    size_t inter_bytes = 0;
    for (size_t j = 0; j < h.count(); ++j) {
      if (static_cast<int>(j) == me) continue;
      // My block goes to island j's owners of it ...
      auto parts = island_partition(h, static_cast<int>(j), island_range(h, me, off));
      for (size_t q = 0; q < parts.size(); ++q) {
        Range o = overlap(my_block, parts[q]);
        if (o.size() == 0) continue;
        bridge.send(out.slice(o.begin, o.size()), h.islands[j][q]);
        inter_bytes += static_cast<size_t>(o.size()) * dtype_size(out.dtype);
      }
      // ... and my piece of island j's range comes from its block owners.
      Range piece = island_partition(h, me, island_range(h, static_cast<int>(j), off))[h.local_index[rank]];
      for (int owner : h.islands[j]) {
        Range o = overlap(piece, Range{off[owner], off[owner + 1]});
        if (o.size() > 0) bridge.recv(out.slice(o.begin, o.size()), owner);
      }
    }
    bridge.finish();
    record.staged_bytes = bridge.staged_bytes();
    // Phase 2: inside the island, every island's range.
    for (size_t j = 0; j < h.count(); ++j) {
      Range r = island_range(h, static_cast<int>(j), off);
      std::vector<int64_t> local;
      if (static_cast<int>(j) == me) {
        for (int m : h.islands[me]) local.push_back(counts[m]);
      } else {
        for (const Range& p : island_partition(h, me, r)) local.push_back(p.size());
      }
      ring_all_gather_inplace_tagged(*h.intra, out.slice(r.begin, r.size()), local, kTagIntraAG);
    }
    record.tiers.push_back({"inter", inter_bytes, 0});
    record.tiers.push_back({"intra", out.bytes() - a.input.bytes(), 0});
  }
};

}  // namespace

const Algorithm& hier_all_gather_algorithm() {
  static const HierAllGather instance;
  return instance;
}

}  // namespace hcomm
