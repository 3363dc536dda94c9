// One accessor per algorithm file, listed in table.cpp.
#pragma once

#include "core/algo/algorithm.h"

namespace hcomm {
const Algorithm& native_algorithm();                 // native.cpp
const Algorithm& ring_all_reduce_algorithm();        // ring_all_reduce.cpp
const Algorithm& ring_reduce_scatter_algorithm();    // ring_reduce_scatter.cpp
const Algorithm& ring_all_gather_algorithm();        // ring_all_gather.cpp
const Algorithm& tree_broadcast_algorithm();         // tree_broadcast.cpp
const Algorithm& direct_rooted_algorithm();          // direct_rooted.cpp
const Algorithm& pairwise_all_to_all_algorithm();    // pairwise_all_to_all.cpp
const Algorithm& dissemination_barrier_algorithm();  // dissemination_barrier.cpp
const Algorithm& hier_all_reduce_algorithm();        // hier_all_reduce.cpp
const Algorithm& hier_reduce_scatter_algorithm();    // hier_reduce_scatter.cpp
const Algorithm& hier_all_gather_algorithm();        // hier_all_gather.cpp
const Algorithm& hier_broadcast_algorithm();         // hier_broadcast.cpp
}  // namespace hcomm
