#include "core/validate.h"

#include <sstream>

#include "core/error.h"

namespace hcomm {
namespace {

[[noreturn]] void fail(const CollectiveArgs& args, int rank, const std::string& what) {
  std::ostringstream s;
  s << "hcomm: " << args.describe() << " on rank " << rank << ": " << what;
  throw Error(ErrorKind::kInvalidArgument, s.str());
}

// The per-rank counts of an uneven collective (`what` is "input" or
// "output", the tensor they split), checked before any byte moves: the right
// number of entries, each one on its own non-negative and within the tensor,
// and an overflow-checked sum equal to it.  Bounding each entry first names
// the bad one ([3, 2^63-1, 2^63-1, 9] wraps to 10, so the sum alone cannot)
// and keeps the sum far from int64's range; the checked sum stays as the
// guarantee the algorithms rely on.  These checks read only the counts and
// the tensor they split, so ranks given the same sizes and shapes all refuse
// alike and none waits for a peer that refused; the own-entry checks in
// validate_args below are the exception (only that rank can see them).
void check_counts(const CollectiveArgs& args, int rank, int size, const std::vector<int64_t>& counts,
                  const char* name, int64_t expected_total, const char* what) {
  if (static_cast<int>(counts.size()) != size) {
    std::ostringstream s;
    s << name << " has " << counts.size() << " entries but the group has " << size << " ranks";
    fail(args, rank, s.str());
  }
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] < 0)
      fail(args, rank, std::string(name) + " has a negative entry " + std::to_string(counts[i]) + " at index " +
                           std::to_string(i));
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > expected_total) {
      std::ostringstream s;
      s << name << "[" << i << "] = " << counts[i] << " exceeds the " << what << "'s " << expected_total
        << " elements";
      fail(args, rank, s.str());
    }
  int64_t total = 0;
  if (!checked_total(counts, &total)) fail(args, rank, std::string(name) + " overflows int64 when summed");
  if (total != expected_total) {
    std::ostringstream s;
    s << name << " sums to " << total << " elements but the " << what << " has " << expected_total;
    fail(args, rank, s.str());
  }
}

}  // namespace

void validate_args(const CollectiveArgs& a, int rank, int size) {
  if (a.input.count < 0 || a.output.count < 0) fail(a, rank, "negative element count");
  if (a.input.dtype != a.output.dtype && a.kind != OpKind::kBarrier)
    fail(a, rank, std::string("input dtype ") + dtype_name(a.input.dtype) + " differs from output dtype " +
                      dtype_name(a.output.dtype));
  const bool rooted = a.kind == OpKind::kReduce || a.kind == OpKind::kBroadcast || a.kind == OpKind::kGather ||
                      a.kind == OpKind::kScatter;
  if (rooted && (a.root < 0 || a.root >= size))
    fail(a, rank, "root " + std::to_string(a.root) + " is out of range for a group of " + std::to_string(size));
  if (a.is_reduction()) {
    std::string why;
    if (!reduce_supported(a.input.dtype, a.reduce, &why)) fail(a, rank, why);
  }
  const int64_t in = a.input.count, out = a.output.count;
  switch (a.kind) {
    case OpKind::kAllGather:
      if (out != in * size)
        fail(a, rank, "output has " + std::to_string(out) + " elements; expected world size " +
                          std::to_string(size) + " x input " + std::to_string(in) + " = " + std::to_string(in * size));
      break;
    case OpKind::kAllGatherV:
      check_counts(a, rank, size, a.output_counts, "output_split_sizes", out, "output");
      if (a.output_counts[rank] != in)
        fail(a, rank, "output_split_sizes[" + std::to_string(rank) + "] is " + std::to_string(a.output_counts[rank]) +
                          " but this rank's input has " + std::to_string(in) + " elements");
      break;
    case OpKind::kReduceScatter:
      if (in != out * size)
        fail(a, rank, "input has " + std::to_string(in) + " elements; expected world size " + std::to_string(size) +
                          " x output " + std::to_string(out) + " = " + std::to_string(out * size));
      break;
    case OpKind::kReduceScatterV:
      check_counts(a, rank, size, a.input_counts, "input_split_sizes", in, "input");
      if (a.input_counts[rank] != out)
        fail(a, rank, "input_split_sizes[" + std::to_string(rank) + "] is " + std::to_string(a.input_counts[rank]) +
                          " but this rank's output has " + std::to_string(out) + " elements");
      break;
    case OpKind::kAllToAll:
      if (in != out) fail(a, rank, "input has " + std::to_string(in) + " elements but output has " + std::to_string(out));
      if (in % size != 0)
        fail(a, rank, std::to_string(in) + " elements do not split evenly over " + std::to_string(size) + " ranks");
      break;
    case OpKind::kAllToAllV:
      check_counts(a, rank, size, a.input_counts, "input_split_sizes", in, "input");
      check_counts(a, rank, size, a.output_counts, "output_split_sizes", out, "output");
      // What a rank sends itself is what it receives from itself: a rank
      // whose own two entries differ would write past its own block.
      if (a.input_counts[rank] != a.output_counts[rank])
        fail(a, rank, "input_split_sizes[" + std::to_string(rank) + "] = " + std::to_string(a.input_counts[rank]) +
                          " (sent to itself) differs from output_split_sizes[" + std::to_string(rank) + "] = " +
                          std::to_string(a.output_counts[rank]) + " (received from itself)");
      break;
    case OpKind::kGather:
      if (rank == a.root && out != in * size)
        fail(a, rank, "root's output has " + std::to_string(out) + " elements; expected " + std::to_string(in * size));
      break;
    case OpKind::kScatter:
      if (rank == a.root && in != out * size)
        fail(a, rank, "root's input has " + std::to_string(in) + " elements; expected " + std::to_string(out * size));
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      if (a.peer == rank) fail(a, rank, "cannot send to or receive from itself");
      if (a.peer >= size || (a.peer < 0 && a.kind == OpKind::kSend) || a.peer < -1)
        fail(a, rank, "peer " + std::to_string(a.peer) + " is out of range for a group of " + std::to_string(size));
      break;
    default: break;
  }
}

}  // namespace hcomm
