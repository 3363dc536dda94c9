// Argument checks made on the calling thread before any communication, so a
// wrong size fails on the rank that passed it with a message naming it,
// instead of hanging its peers.
#pragma once

#include "core/op.h"

namespace hcomm {

// Throws an invalid-argument Error naming the op, dtype, sizes and rank.
void validate_args(const CollectiveArgs& args, int rank, int size);

}  // namespace hcomm
