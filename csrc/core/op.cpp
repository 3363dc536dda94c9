#include "core/op.h"

#include <sstream>

#include "core/error.h"

namespace hcomm {

const char* op_name(OpKind kind) {
  static const char* names[] = {"all_reduce", "reduce", "broadcast", "all_gather", "all_gather_v",
                                "reduce_scatter", "reduce_scatter_v", "all_to_all", "all_to_all_v",
                                "gather", "scatter", "send", "recv", "barrier"};
  int i = static_cast<int>(kind);
  return (i >= 0 && i < static_cast<int>(OpKind::kCount)) ? names[i] : "unknown-op";
}

size_t CollectiveArgs::payload_bytes() const {
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
    case OpKind::kGather:
      return output.count > 0 ? output.bytes() : input.bytes();
    case OpKind::kBarrier: return 0;
    default: return input.bytes() > 0 ? input.bytes() : output.bytes();
  }
}

std::string CollectiveArgs::describe() const {
  std::ostringstream s;
  s << op_name(kind) << "(" << dtype_name(input.dtype) << " x " << input.count;
  if (output.data != input.data || output.count != input.count) s << " -> " << output.count;
  if (is_reduction()) s << ", " << reduce_op_name(reduce);
  if (kind == OpKind::kReduce || kind == OpKind::kBroadcast || kind == OpKind::kGather || kind == OpKind::kScatter)
    s << ", root " << root;
  if (kind == OpKind::kSend || kind == OpKind::kRecv) s << ", peer " << peer << ", tag " << tag;
  s << ")";
  return s.str();
}

namespace {
[[noreturn]] void sum_overflows(const std::vector<int64_t>& counts, size_t at) {
  throw Error(ErrorKind::kInvalidArgument, "hcomm: per-rank counts overflow int64 when summed (entry " +
                                               std::to_string(at) + " = " + std::to_string(counts[at]) + ")");
}
}  // namespace

bool checked_total(const std::vector<int64_t>& counts, int64_t* total) {
  int64_t t = 0;
  for (int64_t c : counts)
    if (__builtin_add_overflow(t, c, &t)) return false;
  *total = t;
  return true;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i)
    if (__builtin_add_overflow(off[i], counts[i], &off[i + 1])) sum_overflows(counts, i);
  return off;
}

int64_t total_of(const std::vector<int64_t>& counts) {
  int64_t t = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (__builtin_add_overflow(t, counts[i], &t)) sum_overflows(counts, i);
  return t;
}

std::vector<int64_t> even_counts(int64_t n, int parts) {
  std::vector<int64_t> c(parts, parts > 0 ? n / parts : 0);
  for (int64_t i = 0; i < (parts > 0 ? n % parts : 0); ++i) c[i] += 1;
  return c;
}

}  // namespace hcomm
