// "hier_bcast": broadcast as a tree across islands: the root sends once to
// one leader per other island over the slow tier, then every island
// broadcasts inside itself on its fast library.  A flat binomial tree would
// cross the slow tier up to log2(n) times on the critical path.
#include "core/algo/cost.h"
#include "core/algo/hier.h"
#include "core/algo/registry.h"
#include "core/stage/bridge.h"

namespace hcomm {
namespace {

class HierBroadcast final : public Algorithm {
 public:
  const char* name() const override { return "hier_bcast"; }
  const char* description() const override { return "root to one leader per island, then intra-island broadcast"; }
  bool supports(const CollectiveArgs& a, const AlgoContext& ctx, std::string* why) const override {
    return hier_applies(a, ctx, {OpKind::kBroadcast}, false, why);
  }
  double cost(const CollectiveArgs& a, const AlgoContext& ctx) const override {
    const Hierarchy& h = *ctx.hierarchy;
    const double bytes = static_cast<double>(a.input.bytes());
    size_t biggest = 1;
    for (const auto& m : h.islands) biggest = std::max(biggest, m.size());
    CollectiveArgs intra = a;
    return h.inter_link.time(bytes * (h.count() - 1), h.count() - 1) +
           flat_cost(intra, static_cast<int>(biggest), h.intra_link);
  }
  void run(const CollectiveArgs& a, AlgoContext& ctx, OpRecord& record) const override {
    const Hierarchy& h = *ctx.hierarchy;
    Transport& flat = *ctx.flat;
    const int rank = flat.rank(), me = h.island_of[rank], root_island = h.island_of[a.root];
    // The root leads its own island; elsewhere the island's first rank does.
    auto leader = [&](int island) { return island == root_island ? a.root : h.islands[island].front(); };
    size_t inter_bytes = 0;
    // Host-staged when the buffer is device memory: the root copies it up
    // once for every leader, a leader copies it down as its chunks arrive.
    stage::Bridge bridge(flat, staging_engine(h, a.input), h.bridge_chunk_bytes, kTagInter);
    if (rank == a.root) {
      for (size_t j = 0; j < h.count(); ++j) {
        if (static_cast<int>(j) == root_island || a.input.count == 0) continue;
        bridge.send(a.input, leader(static_cast<int>(j)));
        inter_bytes += a.input.bytes();
      }
    } else if (rank == leader(me) && a.input.count > 0) {
      bridge.recv(a.input, a.root);
    }
    bridge.finish();
    record.staged_bytes = bridge.staged_bytes();
    CollectiveArgs intra = a;
    intra.root = h.local_index[leader(me)];
    run_flat(*h.intra, intra, ctx, record);
    record.tiers.push_back({"inter", inter_bytes, 0});
  }
};

}  // namespace

const Algorithm& hier_broadcast_algorithm() {
  static const HierBroadcast instance;
  return instance;
}

}  // namespace hcomm
