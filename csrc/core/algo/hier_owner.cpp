// The cross-island step of the hierarchical all-reduce as a reduce-scatter
// and all-gather across islands, with each island's share of the reducing
// sized by its uplink.
//
// The direct exchange (hier.cpp) sends every island's partial of every
// element to every other island: (k-1) x bytes each way on every island's
// uplink, so with k >= 3 islands the slowest uplink carries twice or more
// what it must.  Here island j reduces the elements of its owner range O_j
// (owner ranks: its members whose partition overlaps O_j): the other islands
// send their partials of O_j there (phase 1), and the owners send the
// results back (phase 2).  An island moves (1 - f_j) B + (k-1) f_j B each way
// for a share f_j, so a slow uplink gets a small share (none when others
// can carry it), and the slowest island moves B instead of (k-1) B.  Each
// element is still reduced once, in island order, so every rank gets the
// same bits as with the direct exchange.
#include <algorithm>
#include <cstring>

#include "core/algo/hier.h"
#include "core/kernels/reduce.h"

namespace hcomm {

std::vector<double> island_betas(const Hierarchy& h) {
  if (h.island_beta.size() == h.count()) return h.island_beta;
  return std::vector<double>(h.count(), h.inter_link.beta);
}

std::vector<double> owner_shares(const std::vector<double>& beta) {
  const size_t k = beta.size();
  std::vector<double> f(k, k ? 1.0 / static_cast<double>(k) : 0.0);
  if (k < 3) return f;  // with two islands every share moves B each way: equal is as good as any
  // Smallest T (seconds per byte of B) such that the shares f_i = (T beta_i - 1) / (k - 2),
  // clamped to [0, 1], cover the buffer; bisection on T.
  auto cover = [&](double t) {
    double sum = 0;
    for (double b : beta) sum += std::clamp((t * b - 1.0) / static_cast<double>(k - 2), 0.0, 1.0);
    return sum;
  };
  double lo = 0, hi = 1;
  while (cover(hi) < 1.0) hi *= 2;
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    (cover(mid) < 1.0 ? lo : hi) = mid;
  }
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += (f[i] = std::clamp((hi * beta[i] - 1.0) / static_cast<double>(k - 2), 0.0, 1.0));
  for (double& x : f) x /= sum;
  return f;
}

std::vector<Range> owner_ranges(const std::vector<double>& shares, Range whole) {
  std::vector<Range> out(shares.size());
  int64_t at = whole.begin;
  double acc = 0;
  for (size_t j = 0; j < shares.size(); ++j) {
    acc += shares[j];
    const int64_t end = j + 1 == shares.size() ? whole.end
                                               : whole.begin + static_cast<int64_t>(acc * static_cast<double>(whole.size()));
    out[j] = Range{at, std::max(at, std::min(end, whole.end))};
    at = out[j].end;
  }
  return out;
}

namespace {
// What this rank reduces: its partition's part of its island's owner range.
Range owned_by_me(const Hierarchy& h, int rank, const std::vector<std::vector<Range>>& partitions,
                  const std::vector<Range>& owners) {
  const int me = h.island_of[rank];
  return overlap(partitions[me][h.local_index[rank]], owners[me]);
}
}  // namespace

void owner_reduce_phase(Transport& flat, const Hierarchy& h, const Buffer& buf,
                        const std::vector<std::vector<Range>>& partitions, const std::vector<Range>& owners,
                        ReduceOp op, int divide_by, std::vector<uint8_t>& scratch, size_t* bytes_sent) {
  const int rank = flat.rank();
  const int me = h.island_of[rank];
  const Range mine = partitions[me][h.local_index[rank]];
  const size_t esize = dtype_size(buf.dtype);
  const size_t k = h.count();
  const Range owned = owned_by_me(h, rank, partitions, owners);
  const size_t per_island = static_cast<size_t>(owned.size()) * esize;
  if (scratch.size() < per_island * k) scratch.resize(per_island * k);
  // My partials of the other islands' owner ranges to their owners; theirs of what I own to me.
  std::vector<std::unique_ptr<Pending>> ops;
  for (size_t j = 0; j < k; ++j) {
    if (static_cast<int>(j) == me) continue;
    for (size_t q = 0; q < partitions[j].size(); ++q) {
      const int peer = h.islands[j][q];
      Range out = overlap(overlap(mine, owners[j]), partitions[j][q]);
      if (out.size() > 0) {
        ops.push_back(flat.isend(buf.slice(out.begin, out.size()), peer, kTagInter));
        if (bytes_sent) *bytes_sent += static_cast<size_t>(out.size()) * esize;
      }
      Range in = overlap(owned, partitions[j][q]);
      if (in.size() > 0) {
        Buffer dst = buf;
        dst.data = scratch.data() + j * per_island + static_cast<size_t>(in.begin - owned.begin) * esize;
        dst.count = in.size();
        ops.push_back(flat.irecv(dst, peer, kTagInter));
      }
    }
  }
  for (auto& p : ops) p->wait();
  if (owned.size() == 0) return;
  // Reduce in island order (the same sequence as the direct exchange).
  Buffer acc = buf.slice(owned.begin, owned.size());
  if (me != 0) {
    std::vector<uint8_t> own(per_island);
    std::memcpy(own.data(), acc.data, per_island);
    std::memcpy(acc.data, scratch.data(), per_island);
    for (size_t j = 1; j < k; ++j)
      kernels::reduce_into(acc.data, static_cast<int>(j) == me ? own.data() : scratch.data() + j * per_island,
                           acc.count, acc.dtype, op);
  } else {
    for (size_t j = 1; j < k; ++j) kernels::reduce_into(acc.data, scratch.data() + j * per_island, acc.count, acc.dtype, op);
  }
  if (divide_by > 1) kernels::divide_by(acc.data, acc.count, acc.dtype, divide_by);
}

void owner_return_phase(Transport& flat, const Hierarchy& h, const Buffer& buf,
                        const std::vector<std::vector<Range>>& partitions, const std::vector<Range>& owners,
                        size_t* bytes_sent) {
  const int rank = flat.rank();
  const int me = h.island_of[rank];
  const Range mine = partitions[me][h.local_index[rank]];
  const size_t esize = dtype_size(buf.dtype);
  const Range owned = owned_by_me(h, rank, partitions, owners);
  // Results of what I own to the other islands; theirs of the rest of my partition to me.
  std::vector<std::unique_ptr<Pending>> ops;
  for (size_t j = 0; j < h.count(); ++j) {
    if (static_cast<int>(j) == me) continue;
    for (size_t q = 0; q < partitions[j].size(); ++q) {
      const int peer = h.islands[j][q];
      Range out = overlap(owned, partitions[j][q]);
      if (out.size() > 0) {
        ops.push_back(flat.isend(buf.slice(out.begin, out.size()), peer, kTagInterReturn));
        if (bytes_sent) *bytes_sent += static_cast<size_t>(out.size()) * esize;
      }
      Range in = overlap(overlap(mine, owners[j]), partitions[j][q]);
      if (in.size() > 0) ops.push_back(flat.irecv(buf.slice(in.begin, in.size()), peer, kTagInterReturn));
    }
  }
  for (auto& p : ops) p->wait();
}

}  // namespace hcomm
