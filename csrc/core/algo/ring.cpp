#include "core/algo/ring.h"

#include "core/kernels/reduce.h"

namespace hcomm {

void ring_reduce_scatter_inplace(Transport& t, const Buffer& work, const std::vector<int64_t>& counts,
                                 ReduceOp op, AlgoContext& ctx) {
  ring_reduce_scatter_inplace_tagged(t, work, counts, op, ctx, kAlgoTag);
}

void ring_all_gather_inplace(Transport& t, const Buffer& out, const std::vector<int64_t>& counts) {
  ring_all_gather_inplace_tagged(t, out, counts, kAlgoTag);
}

void ring_reduce_scatter_inplace_tagged(Transport& t, const Buffer& work, const std::vector<int64_t>& counts,
                                        ReduceOp op, AlgoContext& ctx, int tag) {
  const int n = t.size(), r = t.rank();
  if (n == 1) return;
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  const std::vector<int64_t> off = offsets_of(counts);
  int64_t max_count = 0;
  for (int64_t c : counts) max_count = std::max(max_count, c);
  Buffer tmp = work;
  tmp.data = ctx.scratch_bytes(static_cast<size_t>(max_count) * dtype_size(work.dtype));
  // Step s sends block r-s-1 and receives block r-s-2, so that after n-1
  // steps the fully reduced block that lands here is block r itself.
  for (int s = 0; s < n - 1; ++s) {
    const int send_idx = ((r - s - 1) % n + n) % n;
    const int recv_idx = ((r - s - 2) % n + n) % n;
    std::unique_ptr<Pending> recv, send;
    if (counts[recv_idx] > 0) recv = t.irecv(tmp.slice(0, counts[recv_idx]), left, tag);
    if (counts[send_idx] > 0) send = t.isend(work.slice(off[send_idx], counts[send_idx]), right, tag);
    if (recv) {
      recv->wait();
      kernels::reduce_into(work.slice(off[recv_idx], 0).data, tmp.data, counts[recv_idx], work.dtype, op);
    }
    if (send) send->wait();
  }
}

void ring_all_gather_inplace_tagged(Transport& t, const Buffer& out, const std::vector<int64_t>& counts, int tag) {
  const int n = t.size(), r = t.rank();
  if (n == 1) return;
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  const std::vector<int64_t> off = offsets_of(counts);
  for (int s = 0; s < n - 1; ++s) {
    const int send_idx = ((r - s) % n + n) % n;
    const int recv_idx = ((r - s - 1) % n + n) % n;
    std::unique_ptr<Pending> recv, send;
    if (counts[recv_idx] > 0) recv = t.irecv(out.slice(off[recv_idx], counts[recv_idx]), left, tag);
    if (counts[send_idx] > 0) send = t.isend(out.slice(off[send_idx], counts[send_idx]), right, tag);
    if (recv) recv->wait();
    if (send) send->wait();
  }
}

double ring_cost(const LinkModel& link, int n, double total_bytes) {
  if (n <= 1) return 0;
  return (n - 1) * link.alpha + (n - 1) * (total_bytes / n) / link.beta;
}

}  // namespace hcomm
