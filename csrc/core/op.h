// One description of a collective call, shared by the Communicator API, the
// algorithms and the vendor transports ("options object plus a function").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/types.h"

namespace hcomm {

enum class OpKind : int {
  kAllReduce = 0,
  kReduce,
  kBroadcast,
  kAllGather,       // equal counts: output = size * input
  kAllGatherV,      // output_counts[r] elements from rank r
  kReduceScatter,   // equal counts: input = size * output
  kReduceScatterV,  // input_counts[r] elements end on rank r
  kAllToAll,        // equal splits
  kAllToAllV,       // input_counts = send splits, output_counts = receive splits
  kGather,          // output (root only) = size * input
  kScatter,         // input (root only) = size * output
  kSend,
  kRecv,
  kBarrier,
  kCount
};

const char* op_name(OpKind kind);

struct CollectiveArgs {
  OpKind kind = OpKind::kAllReduce;
  Buffer input;   // for in-place ops (all_reduce, broadcast, reduce) input == output
  Buffer output;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;   // reduce, broadcast, gather, scatter
  int peer = -1;  // send, recv (-1 on recv: any source)
  int tag = 0;
  std::vector<int64_t> input_counts;   // per rank, elements
  std::vector<int64_t> output_counts;  // per rank, elements
  // The caller's tensor shape (none: not given).  Only HCOMM_DEBUG reads it,
  // so that [2, 3] against [3, 2] is caught although the element counts
  // agree (what TORCH_DISTRIBUTED_DEBUG=DETAIL compares), and named as written.
  std::optional<std::vector<int64_t>> shape;

  bool is_reduction() const {
    return kind == OpKind::kAllReduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter ||
           kind == OpKind::kReduceScatterV;
  }
  // Bytes this rank contributes: the size nccl-tests reports for the op.
  size_t payload_bytes() const;
  // "all_reduce(float32 x 1000, sum)" for messages.
  std::string describe() const;
};

// Per-rank element counts (uneven collectives): prefix offsets and total.
// Sums are overflow-checked: a wrapped sum can equal a buffer's length
// ([3, 2^63-1, 2^63-1, 9] "sums" to 10), so acting on one would index far
// past the buffer.  checked_total returns false instead of wrapping;
// offsets_of and total_of throw an invalid-argument Error.
bool checked_total(const std::vector<int64_t>& counts, int64_t* total);
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts);
int64_t total_of(const std::vector<int64_t>& counts);
// Splits `n` elements into `parts` near-equal counts (the first n % parts get one more).
std::vector<int64_t> even_counts(int64_t n, int parts);

}  // namespace hcomm
