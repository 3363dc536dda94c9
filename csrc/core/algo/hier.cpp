#include "core/algo/hier.h"

#include <algorithm>
#include <cstring>

#include "core/kernels/reduce.h"
#include "core/stage/copy_engine.h"

namespace hcomm {

Range overlap(Range a, Range b) { return Range{std::max(a.begin, b.begin), std::min(a.end, b.end)}; }

std::vector<Range> island_partition(const Hierarchy& h, int island, Range whole) {
  const std::vector<int>& members = h.islands[island];
  const int n = static_cast<int>(members.size());
  const int64_t total = whole.size();
  std::vector<int64_t> counts;
  if (h.proportional && !h.inter_weight.empty()) {
    double sum = 0;
    for (int r : members) sum += h.inter_weight[r];
    counts.resize(n);
    int64_t given = 0;
    for (int i = 0; i < n; ++i) {
      counts[i] = sum > 0 ? static_cast<int64_t>(total * (h.inter_weight[members[i]] / sum)) : total / n;
      given += counts[i];
    }
    for (int64_t i = 0; given < total; ++i, ++given) counts[i % n] += 1;  // rounding remainder
  } else {
    counts = even_counts(total, n);
  }
  std::vector<Range> parts(n);
  int64_t at = whole.begin;
  for (int i = 0; i < n; ++i) {
    parts[i] = Range{at, at + counts[i]};
    at += counts[i];
  }
  return parts;
}

void inter_island_all_reduce(Transport& flat, const Hierarchy& h, const Buffer& buf,
                             const std::vector<std::vector<Range>>& partitions, ReduceOp op,
                             std::vector<uint8_t>& scratch, size_t* bytes_sent) {
  const int rank = flat.rank();
  const int me = h.island_of[rank];
  const Range mine = partitions[me][h.local_index[rank]];
  if (mine.size() == 0 || h.count() < 2) return;
  const size_t esize = dtype_size(buf.dtype);
  // Receive every other island's partial of my range into scratch, laid out
  // island by island, so the reduction below can run in island order.
  const size_t per_island = static_cast<size_t>(mine.size()) * esize;
  if (scratch.size() < per_island * h.count()) scratch.resize(per_island * h.count());
  std::vector<std::unique_ptr<Pending>> ops;
  for (size_t j = 0; j < h.count(); ++j) {
    if (static_cast<int>(j) == me) continue;
    for (size_t q = 0; q < partitions[j].size(); ++q) {
      Range o = overlap(mine, partitions[j][q]);
      if (o.size() == 0) continue;
      const int peer = h.islands[j][q];
      Buffer dst = buf;
      dst.data = scratch.data() + j * per_island + static_cast<size_t>(o.begin - mine.begin) * esize;
      dst.count = o.size();
      ops.push_back(flat.irecv(dst, peer, kTagInter));
      ops.push_back(flat.isend(buf.slice(o.begin, o.size()), peer, kTagInter));
      if (bytes_sent) *bytes_sent += static_cast<size_t>(o.size()) * esize;
    }
  }
  for (auto& p : ops) p->wait();
  // acc = island 0's partial, then += island 1's, ... : the same sequence on
  // every owner, whichever island it is in.
  Buffer acc = buf.slice(mine.begin, mine.size());
  if (me != 0) {
    std::vector<uint8_t> own(per_island);
    std::memcpy(own.data(), acc.data, per_island);
    std::memcpy(acc.data, scratch.data(), per_island);
    for (size_t j = 1; j < h.count(); ++j) {
      const void* src = static_cast<int>(j) == me ? own.data() : scratch.data() + j * per_island;
      kernels::reduce_into(acc.data, src, acc.count, acc.dtype, op);
    }
  } else {
    for (size_t j = 1; j < h.count(); ++j)
      kernels::reduce_into(acc.data, scratch.data() + j * per_island, acc.count, acc.dtype, op);
  }
}

}  // namespace hcomm

namespace hcomm {

bool hier_applies(const CollectiveArgs& a, const AlgoContext& ctx, std::initializer_list<OpKind> kinds,
                  bool contiguous, std::string* why) {
  auto no = [why](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  bool kind_ok = false;
  for (OpKind k : kinds) kind_ok = kind_ok || a.kind == k;
  if (!kind_ok) return no("");
  if (ctx.hierarchy == nullptr || ctx.hierarchy->count() < 2) return no("the group spans one island");
  if (contiguous && !islands_contiguous(*ctx.hierarchy)) return no("islands are not contiguous rank ranges");
  if (a.input.device != DeviceKind::kCPU) {
    if (!staging_engine(*ctx.hierarchy, a.input)) return no("no copy engine for this rank's device memory");
    // The bridge (stage/) carries the cross-island tier of device buffers;
    // the intra-island tier on the device library (NCCL/HCCL natively
    // through run_flat) has not run on a GPU yet, so device buffers stay on
    // the device backend until it has.  HCOMM_FORCE_STAGING runs the bridge.
    return no("device buffers: the intra-island tier on the device library is not verified on hardware yet");
  }
  return true;
}

stage::CopyEngine* staging_engine(const Hierarchy& h, const Buffer& b) {
  return h.staging && h.staging->device() == b.device ? h.staging.get() : nullptr;
}

std::vector<std::vector<Range>> shifted(std::vector<std::vector<Range>> parts, int64_t by) {
  for (auto& island : parts)
    for (Range& r : island) r.begin += by, r.end += by;
  return parts;
}

bool islands_contiguous(const Hierarchy& h) {
  for (const auto& members : h.islands)
    for (size_t i = 1; i < members.size(); ++i)
      if (members[i] != members[i - 1] + 1) return false;
  return true;
}

void run_flat(Transport& t, const CollectiveArgs& args, AlgoContext& parent, OpRecord& record) {
  // The parent's context less its hierarchy: every reused buffer and setting carries over by itself.
  // So the flat algorithm may reuse the parent's `copy` and scratch: a caller must not hold them across
  // this call (hier_broadcast, the one caller, holds neither).
  AlgoContext ctx = parent;
  ctx.flat = &t;
  ctx.hierarchy = nullptr;
  ctx.flat_link = parent.hierarchy ? parent.hierarchy->intra_link : parent.flat_link;
  Selection sel = select_algorithm(args, ctx, "");
  OpRecord inner;
  sel.algorithm->run(args, ctx, inner);
  (void)record;
}

Range island_range(const Hierarchy& h, int island, const std::vector<int64_t>& offsets) {
  const auto& m = h.islands[island];
  return Range{offsets[m.front()], offsets[m.back() + 1]};
}

}  // namespace hcomm
