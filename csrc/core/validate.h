// Argument checks made on the calling thread before any communication, so a
// wrong size fails on the rank that passed it with a message naming it,
// instead of hanging its peers.
#pragma once

#include "core/op.h"

namespace hcomm {

// Throws an invalid-argument Error naming the op, dtype, sizes and rank.
// Uneven counts are checked entry by entry, with overflow-checked sums, so
// no wrapped or out-of-range size reaches an algorithm.
void validate_args(const CollectiveArgs& args, int rank, int size);

}  // namespace hcomm
