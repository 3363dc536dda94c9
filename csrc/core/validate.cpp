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

void check_counts(const CollectiveArgs& args, int rank, int size, const std::vector<int64_t>& counts,
                  const char* name, int64_t expected_total, const char* total_name) {
  if (static_cast<int>(counts.size()) != size) {
    std::ostringstream s;
    s << name << " has " << counts.size() << " entries but the group has " << size << " ranks";
    fail(args, rank, s.str());
  }
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] < 0) fail(args, rank, std::string(name) + " has a negative entry " + std::to_string(counts[i]));
  if (total_of(counts) != expected_total) {
    std::ostringstream s;
    s << name << " sums to " << total_of(counts) << " elements but " << total_name << " has " << expected_total;
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
      check_counts(a, rank, size, a.output_counts, "output_split_sizes", out, "the output");
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
      check_counts(a, rank, size, a.input_counts, "input_split_sizes", in, "the input");
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
      check_counts(a, rank, size, a.input_counts, "input_split_sizes", in, "the input");
      check_counts(a, rank, size, a.output_counts, "output_split_sizes", out, "the output");
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
