// HCOMM_DEBUG: before each collective every rank all-gathers a small
// signature of the call it is about to make; a rank whose call differs is
// named, in the words the user wrote the call in (op, reduce op, root,
// shape), before the mismatched collective can hang or corrupt data.
#include <algorithm>
#include <cctype>

#include "core/algo/ring.h"
#include "core/communicator.h"
#include "core/error.h"

namespace hcomm {

namespace {

constexpr int kMaxDims = 8;  // dims sent as such; deeper shapes also compare by hash
enum Slot : int { kSeq, kKind, kInvalid, kDtype, kCount, kReduce, kRoot, kNdim, kDims, kHash = kDims + kMaxDims, kSlots };

bool has_root(OpKind k) {
  return k == OpKind::kReduce || k == OpKind::kBroadcast || k == OpKind::kGather || k == OpKind::kScatter;
}

std::string upper(const char* s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;  // SUM, MAX: torch's dist.ReduceOp spelling
}

std::string list_text(const int64_t* v, int64_t n, int64_t shown) {
  std::string s = "[";
  for (int64_t i = 0; i < std::min(n, shown); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (n > shown) s += ", ...";
  return s + "]";
}

// The shape as the user wrote it: "[4, 3]"; "[...] (12 dims)" past kMaxDims.
std::string shape_text(const int64_t* row) {
  const int64_t nd = row[kNdim];
  std::string s = list_text(row + kDims, nd, kMaxDims);
  return nd > kMaxDims ? s + " (" + std::to_string(nd) + " dims)" : s;
}

std::string op_of(const int64_t* row) { return op_name(static_cast<OpKind>(row[kKind])); }

// The value most ranks hold (ties: the lowest rank's) is the reference, so
// every rank, the odd one included, names the same disagreeing rank.
template <typename Same>
int reference_rank(int n, Same same) {
  int best_rank = 0, best_votes = 0;
  for (int r = 0; r < n; ++r) {
    int votes = 0;
    for (int q = 0; q < n; ++q) votes += same(q, r);
    if (votes > best_votes) best_rank = r, best_votes = votes;
  }
  return best_rank;
}

}  // namespace

void Communicator::debug_check(const CollectiveArgs& a, uint64_t seq, bool invalid) {
  int64_t count = a.input.count;
  switch (a.kind) {
    case OpKind::kAllGatherV: count = a.output.count; break;
    case OpKind::kReduceScatter: count = a.output.count; break;
    case OpKind::kAllToAllV: count = 0; break;  // the split check below compares them
    case OpKind::kScatter: count = a.output.count; break;
    case OpKind::kBarrier: count = 0; break;
    default: break;
  }
  std::vector<int64_t> all(kSlots * static_cast<size_t>(size_), 0);
  int64_t* mine = &all[static_cast<size_t>(rank_) * kSlots];
  mine[kSeq] = static_cast<int64_t>(seq);
  mine[kKind] = static_cast<int64_t>(a.kind);
  mine[kInvalid] = invalid ? 1 : 0;
  mine[kDtype] = static_cast<int64_t>(a.input.dtype);
  mine[kCount] = count;
  mine[kReduce] = a.is_reduction() ? static_cast<int64_t>(a.reduce) : -1;
  mine[kRoot] = has_root(a.kind) ? a.root : -1;
  mine[kNdim] = a.shape ? static_cast<int64_t>(a.shape->size()) : -1;
  if (a.shape) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < a.shape->size(); ++i) {
      if (i < static_cast<size_t>(kMaxDims)) mine[kDims + i] = (*a.shape)[i];
      h = (h ^ static_cast<uint64_t>((*a.shape)[i])) * 1099511628211ull;
    }
    mine[kHash] = static_cast<int64_t>(h);
  }
  Buffer out{all.data(), static_cast<int64_t>(all.size()), DType::kInt64};
  ring_all_gather_inplace(*flat_, out, std::vector<int64_t>(size_, kSlots));
  auto row = [&](int r) { return &all[static_cast<size_t>(r) * kSlots]; };

  // One check per thing a user can get wrong, in the order that explains
  // the most: a later field means little once an earlier one differs.
  struct Check {
    int first, last;  // slots compared
    std::string (*say)(int r, const int64_t* mine, int b, const int64_t* ref);
  };
  static const Check checks[] = {
      // First: a rejected call's other fields may be what made it invalid.
      {kInvalid, kInvalid,
       [](int r, const int64_t* m, int b, const int64_t*) {
         const int bad = m[kInvalid] ? r : b;
         return "rank " + std::to_string(bad) + " rejected its " + op_of(m) + " call as invalid (rank " +
                std::to_string(bad) + "'s own error says why)";
       }},
      {kSeq, kKind,
       [](int r, const int64_t* m, int b, const int64_t* f) {
         std::string s = "rank " + std::to_string(r) + " is at collective #" + std::to_string(m[kSeq] + 1) + " (" +
                         op_of(m) + "), rank " + std::to_string(b) + " at #" + std::to_string(f[kSeq] + 1) + " (" +
                         op_of(f) + ")";
         if (m[kSeq] == f[kSeq]) s += "; a rank skipped a collective or called them in a different order";
         return s;
       }},
      {kDtype, kDtype,
       [](int r, const int64_t* m, int b, const int64_t* f) {
         return "rank " + std::to_string(r) + " calls " + op_of(m) + " with dtype " +
                dtype_name(static_cast<DType>(m[kDtype])) + ", rank " + std::to_string(b) + " with " +
                dtype_name(static_cast<DType>(f[kDtype]));
       }},
      {kNdim, kHash,
       [](int r, const int64_t* m, int b, const int64_t* f) {
         return "rank " + std::to_string(r) + " passes shape " + shape_text(m) + ", rank " + std::to_string(b) + " " +
                shape_text(f);
       }},
      {kCount, kCount,
       [](int r, const int64_t* m, int b, const int64_t* f) {
         return "rank " + std::to_string(r) + " calls " + op_of(m) + " with " + std::to_string(m[kCount]) +
                " elements, rank " + std::to_string(b) + " with " + std::to_string(f[kCount]);
       }},
      {kReduce, kReduce,
       [](int r, const int64_t* m, int b, const int64_t* f) {
         return "rank " + std::to_string(r) + " calls " + op_of(m) + " with reduce op " +
                upper(reduce_op_name(static_cast<ReduceOp>(m[kReduce]))) + ", rank " + std::to_string(b) + " with " +
                upper(reduce_op_name(static_cast<ReduceOp>(f[kReduce])));
       }},
      {kRoot, kRoot,
       [](int r, const int64_t* m, int b, const int64_t* f) {
         return "rank " + std::to_string(r) + " calls " + op_of(m) + " with root " + std::to_string(m[kRoot]) +
                ", rank " + std::to_string(b) + " with root " + std::to_string(f[kRoot]);
       }},
  };
  for (const Check& c : checks) {
    auto same = [&](int q, int r) { return std::equal(row(q) + c.first, row(q) + c.last + 1, row(r) + c.first); };
    const int b = reference_rank(size_, same);
    for (int r = 0; r < size_; ++r) {
      if (same(r, b)) continue;
      throw Error(ErrorKind::kRuntime, "hcomm (HCOMM_DEBUG): collective mismatch seen on rank " +
                                           std::to_string(rank_) + " (running " + a.describe() + "): " +
                                           c.say(r, row(r), b, row(b)));
    }
  }
  // Every rank saw the same table, so all agree on whether to go on here
  // (a rejected call's counts may not even have one entry per rank).
  if (invalid) return;
  if (a.kind == OpKind::kAllGatherV || a.kind == OpKind::kReduceScatterV) debug_check_counts(a);
  if (a.kind == OpKind::kAllToAllV) debug_check_splits(a);
}

// all_gather_v / reduce_scatter_v: every rank must pass the same per-rank
// counts, or blocks land at the wrong offsets.
void Communicator::debug_check_counts(const CollectiveArgs& a) {
  const size_t n = static_cast<size_t>(size_);
  const std::vector<int64_t>& counts = a.kind == OpKind::kAllGatherV ? a.output_counts : a.input_counts;
  std::vector<int64_t> all(n * n);
  std::copy(counts.begin(), counts.end(), all.begin() + rank_ * n);
  Buffer out{all.data(), static_cast<int64_t>(all.size()), DType::kInt64};
  ring_all_gather_inplace(*flat_, out, std::vector<int64_t>(n, static_cast<int64_t>(n)));
  auto same = [&](int q, int r) { return std::equal(&all[q * n], &all[q * n] + n, &all[r * n]); };
  const int b = reference_rank(size_, same);
  for (int r = 0; r < size_; ++r) {
    if (same(r, b)) continue;
    throw Error(ErrorKind::kRuntime, "hcomm (HCOMM_DEBUG): collective mismatch seen on rank " + std::to_string(rank_) +
                                         " (running " + a.describe() + "): rank " + std::to_string(r) +
                                         " passes counts " + list_text(&all[r * n], n, 16) + ", rank " +
                                         std::to_string(b) + " " + list_text(&all[b * n], n, 16));
  }
}

// all_to_all_v: what rank q sends to rank r must be what r expects from q,
// or the exchange hangs or truncates.  Every rank all-gathers every rank's
// send and receive splits and checks the whole matrix, so all ranks raise
// the same error, naming both ranks and both counts.
void Communicator::debug_check_splits(const CollectiveArgs& a) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<int64_t> all(2 * n * n);  // per rank: n send splits, then n receive splits
  for (size_t q = 0; q < n; ++q) {
    all[rank_ * 2 * n + q] = a.input_counts[q];
    all[rank_ * 2 * n + n + q] = a.output_counts[q];
  }
  Buffer out{all.data(), static_cast<int64_t>(all.size()), DType::kInt64};
  ring_all_gather_inplace(*flat_, out, std::vector<int64_t>(n, static_cast<int64_t>(2 * n)));
  for (size_t q = 0; q < n; ++q)
    for (size_t r = 0; r < n; ++r) {
      const int64_t sent = all[q * 2 * n + r], expected = all[r * 2 * n + n + q];
      if (sent != expected)
        throw Error(ErrorKind::kRuntime, "hcomm (HCOMM_DEBUG): all_to_all_v split mismatch: rank " +
                                             std::to_string(q) + " sends " + std::to_string(sent) +
                                             " elements to rank " + std::to_string(r) + ", which expects " +
                                             std::to_string(expected));
    }
}

}  // namespace hcomm
