// The algorithm table and the one selection point every collective goes through.
#include <limits>

#include "core/algo/algorithm.h"
#include "core/algo/registry.h"
#include "core/error.h"

namespace hcomm {

const std::vector<const Algorithm*>& algorithm_table() {
  // Order is preference on equal cost: the vendor's own collective first.
  static const std::vector<const Algorithm*> table = {
      &native_algorithm(),
      &hier_all_reduce_algorithm(),
      &hier_reduce_scatter_algorithm(),
      &hier_all_gather_algorithm(),
      &hier_broadcast_algorithm(),
      &ring_all_reduce_algorithm(),
      &ring_reduce_scatter_algorithm(),
      &ring_all_gather_algorithm(),
      &tree_broadcast_algorithm(),
      &direct_rooted_algorithm(),
      &pairwise_all_to_all_algorithm(),
      &dissemination_barrier_algorithm(),
  };
  return table;
}

const Algorithm* find_algorithm(const std::string& name) {
  for (const Algorithm* a : algorithm_table())
    if (name == a->name()) return a;
  return nullptr;
}

Selection select_algorithm(const CollectiveArgs& args, const AlgoContext& ctx, const std::string& forced) {
  Selection sel;
  if (!forced.empty()) {
    const Algorithm* a = find_algorithm(forced);
    std::string why;
    if (a == nullptr) {
      sel.note = "HCOMM_ALGO=" + forced + " is not a known algorithm";
    } else if (a->supports(args, ctx, &why)) {
      sel.algorithm = a;
      sel.predicted_seconds = a->cost(args, ctx);
      return sel;
    } else {
      sel.note = "HCOMM_ALGO=" + forced + " does not support " + args.describe() + ": " + why;
    }
  }
  double best = std::numeric_limits<double>::infinity();
  std::string reasons;
  for (const Algorithm* a : algorithm_table()) {
    std::string why;
    if (!a->supports(args, ctx, &why)) {
      if (!why.empty()) reasons += std::string("\n  ") + a->name() + ": " + why;
      continue;
    }
    double c = a->cost(args, ctx);
    if (c < best) {
      best = c;
      sel.algorithm = a;
    }
  }
  if (sel.algorithm == nullptr)
    throw Error(ErrorKind::kInvalidArgument, "hcomm: no algorithm supports " + args.describe() + reasons);
  sel.predicted_seconds = best;
  return sel;
}

}  // namespace hcomm
