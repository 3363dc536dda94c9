// "hier": hierarchical all-reduce for islands of any sizes.
//
//   1. reduce-scatter inside each island (ring over the island's library),
//   2. all-reduce of each shard across islands, owners matched by overlap
//      (hier.h), so uneven islands (3+1, 3+2+1) need no root-only path:
//      the direct exchange (every island's partial to every other island)
//      or the owner exchange (hier_owner.cpp: islands reduce shares sized
//      by their uplinks, then send the results back), whichever the cost
//      model prices lower; host-staged when the buffer needs it (stage/),
//   3. all-gather inside each island.
//
// Large buffers are cut into chunks that flow through the stages on a
// thread each (the owner exchange's return phase on one more), so the fast
// intra-island tier works on chunk k+1 while the slow inter-island tier
// carries chunk k.  Stages use distinct tags, so their messages never match
// each other's.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "core/algo/cost.h"
#include "core/algo/hier.h"
#include "core/algo/registry.h"
#include "core/algo/ring.h"
#include "core/error.h"
#include "core/kernels/reduce.h"
#include "core/stage/copy_engine.h"

namespace hcomm {
namespace {

constexpr int64_t kMinChunkBytes = 256 << 10;
constexpr int kMaxChunks = 16;

// How a call runs: bytes on the wire per byte of data on the inter tier
// (compression), whether it is host-staged, and whether the cross-island
// step is the owner exchange (with each island's share) or the direct one.
struct Shape {
  double ratio = 1.0;
  bool staged = false;
  bool owner = false;
  std::vector<double> shares;
  int chunks = 1;
  double seconds = 0;
};

// Predicted seconds for one chunk's stages: intra RS, copy up (staged),
// inter exchange (owner: its reduce phase, then its return phase `inter2`),
// copy down (staged), intra AG.  `link`: the owner exchange's two phases of
// successive chunks share each uplink, so a chunk also takes at least the
// uplink's time for both phases' bytes in one direction.
struct StageTimes {
  double rs = 0, up = 0, inter = 0, inter2 = 0, link = 0, down = 0, ag = 0;
};

StageTimes stage_times(const Hierarchy& h, double bytes, const Shape& shape) {
  StageTimes t;
  const std::vector<double> beta = island_betas(h);
  const double k = static_cast<double>(h.count());
  for (size_t i = 0; i < h.count(); ++i) {
    const int s = static_cast<int>(h.islands[i].size());
    const double rs = ring_cost(h.intra_link, s, bytes);
    t.rs = std::max(t.rs, rs);
    t.ag = std::max(t.ag, rs);
    if (shape.staged) t.up = t.down = std::max(t.up, h.stage_link.time(bytes / s));
    // Direct: the island's uplink carries each shard once per other island.
    // Owner: its partials of the others' ranges once, its results k-1 times.
    // Ranks that share an uplink divide its bandwidth.
    const int sharing = h.uplink_sharing.empty() ? 1 : std::max(1, h.uplink_sharing[i]);
    const double per_uplink = bytes * shape.ratio / s * sharing;
    const double a = h.inter_link.alpha * (k - 1.0);
    if (!shape.owner) {
      t.inter = std::max(t.inter, a + per_uplink * (k - 1.0) / beta[i]);
      continue;
    }
    // Share f: reduce phase out (1-f)P, in (k-1)fP; return phase the reverse.
    const double f = shape.shares[i];
    const double one = (1.0 - f) * per_uplink, many = (k - 1.0) * f * per_uplink;
    t.inter = std::max(t.inter, a + std::max(one, many) / beta[i]);
    t.inter2 = std::max(t.inter2, a + std::max(one, many) / beta[i]);
    t.link = std::max(t.link, 2.0 * a + (one + many) / beta[i]);
  }
  return t;
}

double pipelined(const StageTimes& c, int chunks) {
  const double slowest = std::max({c.rs, c.up, c.inter, c.inter2, c.link, c.down, c.ag});
  return c.rs + c.up + c.inter + c.inter2 + c.down + c.ag + (chunks - 1) * slowest;
}

// Sets shape.chunks and shape.seconds: the chunk count the model likes best.
void best_chunks(const Hierarchy& h, double bytes, Shape& shape) {
  shape.chunks = 1;
  shape.seconds = pipelined(stage_times(h, bytes, shape), 1);
  for (int c = 2; c <= kMaxChunks; c *= 2) {
    if (bytes / c < kMinChunkBytes) break;
    double t = pipelined(stage_times(h, bytes / c, shape), c);
    if (t < shape.seconds) shape.chunks = c, shape.seconds = t;
  }
}

// The cheaper of the direct and the owner exchange (from 3 islands up,
// uncompressed) for this call, with its chunk count.
Shape shape_of(const Hierarchy& h, const CollectiveArgs& args) {
  Shape direct;
  if (compressed_inter(h, args)) {
    const double n = 1 << 20;
    direct.ratio = compress::encoded_bytes(static_cast<int64_t>(n), h.wire) / (n * dtype_size(args.input.dtype));
  }
  direct.staged = staging_engine(h, args.input) != nullptr;
  const double bytes = static_cast<double>(args.input.bytes());
  best_chunks(h, bytes, direct);
  // The owner exchange needs 2+ islands (with 2 it moves what the direct
  // one does, in two steps) and runs uncompressed.
  if (h.count() < 2 || direct.ratio != 1.0 || h.exchange == Hierarchy::Exchange::kDirect) return direct;
  if (h.count() < 3 && h.exchange == Hierarchy::Exchange::kAuto) return direct;
  Shape owner = direct;
  owner.owner = true;
  owner.shares = owner_shares(island_betas(h));
  best_chunks(h, bytes, owner);
  if (h.exchange == Hierarchy::Exchange::kOwner) return owner;
  return owner.seconds < direct.seconds ? owner : direct;
}

// A one-shot progress counter a stage waits on, with failure propagation.
struct Progress {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  bool failed = false;
  void advance() {
    { std::lock_guard<std::mutex> l(mu); ++done; }
    cv.notify_all();
  }
  void fail() {
    { std::lock_guard<std::mutex> l(mu); failed = true; }
    cv.notify_all();
  }
  bool wait_for(int k) {  // true when chunk k is done, false when a stage failed
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done > k || failed; });
    return done > k;
  }
};

class HierAllReduce final : public Algorithm {
 public:
  const char* name() const override { return "hier"; }
  const char* description() const override {
    return "hierarchical: intra-island reduce-scatter, cross-island exchange of overlapping shards, "
           "intra-island all-gather; chunk-pipelined; uneven islands";
  }
  bool supports(const CollectiveArgs& args, const AlgoContext& ctx, std::string* why) const override {
    return hier_applies(args, ctx, {OpKind::kAllReduce}, false, why) &&
           reduce_supported(args.input.dtype, args.reduce, why);
  }
  double cost(const CollectiveArgs& args, const AlgoContext& ctx) const override {
    return shape_of(*ctx.hierarchy, args).seconds + static_cast<double>(args.input.bytes()) / ctx.reduce_bandwidth;
  }
  void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const override;
};

void HierAllReduce::run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const {
  const Hierarchy& h = *ctx.hierarchy;
  Transport& flat = *ctx.flat;
  Transport& intra = *h.intra;
  const int rank = flat.rank();
  const int me = h.island_of[rank];
  const int local = h.local_index[rank];
  const Buffer buf = args.input;
  const size_t esize = dtype_size(buf.dtype);
  // Staged (device memory, or the staging mode): only the copy engine
  // touches `buf` on the cross-island step.  Chunk k's reduced range goes up
  // to a host block as soon as the reduce-scatter leaves it (overlapping
  // chunk k-1 on the wire), crosses on the host transport, and goes back
  // down before chunk k's all-gather (overlapping chunk k+1 on the wire).
  stage::CopyEngine* engine = staging_engine(h, buf);
  const Shape shape = shape_of(h, args);
  const int chunks = shape.chunks;
  const std::vector<int64_t> chunk_counts = even_counts(buf.count, chunks);
  const std::vector<int64_t> chunk_off = offsets_of(chunk_counts);
  record.chunk_bytes = static_cast<size_t>(chunk_counts.empty() ? 0 : chunk_counts[0]) * dtype_size(buf.dtype);

  // Per chunk, each island's partition of it; the reduce-scatter inside the
  // island leaves rank `local` with its range reduced over the island.
  auto partitions_of = [&](int k) {
    std::vector<std::vector<Range>> parts(h.count());
    Range whole{chunk_off[k], chunk_off[k] + chunk_counts[k]};
    for (size_t i = 0; i < h.count(); ++i) parts[i] = island_partition(h, static_cast<int>(i), whole);
    return parts;
  };
  auto local_counts = [&](const std::vector<Range>& mine) {
    std::vector<int64_t> c;
    for (const Range& r : mine) c.push_back(r.size());
    return c;
  };

  std::vector<size_t> host_off(chunks + 1, 0);  // chunk k's range in the host block
  stage::HostBlock block;
  std::vector<stage::Ticket> up(chunks), down(chunks);
  if (engine) {
    for (int k = 0; k < chunks; ++k)
      host_off[k + 1] = host_off[k] + static_cast<size_t>(partitions_of(k)[me][local].size()) * esize;
    block = engine->host_block(host_off[chunks]);
    record.staged_bytes = 2 * host_off[chunks];
  }

  size_t intra_bytes = 0, inter_bytes = 0;
  double rs_s = 0, inter_s = 0, ag_s = 0;
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  Progress rs_done, x_done;
  std::exception_ptr rs_error, x_error;

  // One chunk: no pipeline to fill, so run the stages in turn on this thread
  // (three thread start-ups would dominate a small message).
  auto spawn = [chunks](std::function<void()> fn) {
    if (chunks == 1) {
      fn();
      return std::thread();
    }
    return std::thread(std::move(fn));
  };
  std::thread rs_thread = spawn([&] {
    std::vector<uint8_t> own_scratch;
    AlgoContext local_ctx = ctx;
    local_ctx.scratch = ctx.stage_scratch[0] ? ctx.stage_scratch[0] : &own_scratch;
    try {
      for (int k = 0; k < chunks; ++k) {
        auto t0 = clock::now();
        auto parts = partitions_of(k);
        Buffer c = buf.slice(chunk_off[k], chunk_counts[k]);
        ring_reduce_scatter_inplace_tagged(intra, c, local_counts(parts[me]), args.reduce, local_ctx, kTagIntraRS);
        intra_bytes += c.bytes() - static_cast<size_t>(parts[me][local].size()) * esize;
        if (engine) {
          const Range mine = parts[me][local];
          up[k] = engine->to_host(block.data() + host_off[k], buf.slice(mine.begin, 0).data, host_off[k + 1] - host_off[k]);
        }
        rs_s += secs(t0);
        rs_done.advance();
      }
    } catch (...) {
      rs_error = std::current_exception();
      rs_done.fail();
    }
  });
  // The exchange's buffer for chunk k: `buf` itself, or the host copy of my
  // range (element 0 = element mine.begin, so the partitions shift with it).
  struct View {
    Buffer target;
    std::vector<std::vector<Range>> parts;
    int64_t shift = 0;
    Range mine;
  };
  auto view_of = [&](int k) {
    View v{buf, partitions_of(k), 0, {}};
    v.mine = v.parts[me][local];
    if (engine) {
      v.target = Buffer{block.data() + host_off[k], v.mine.size(), buf.dtype};
      v.shift = v.mine.begin;
      v.parts = shifted(std::move(v.parts), -v.shift);
    }
    return v;
  };
  auto owners_of = [&](int k, int64_t shift) {
    return owner_ranges(shape.shares, Range{chunk_off[k] - shift, chunk_off[k] + chunk_counts[k] - shift});
  };
  // Chunk k is back in `buf` (copied down when staged): the all-gather may start.
  auto exchanged = [&](int k, const View& v) {
    if (engine)
      down[k] = engine->to_device(buf.slice(v.mine.begin, 0).data, v.target.data, host_off[k + 1] - host_off[k]);
    x_done.advance();
  };
  Progress reduced;  // owner exchange: chunk k's reduce phase is done
  size_t return_bytes = 0;
  double return_s = 0;
  std::exception_ptr return_error;
  std::thread x_thread = spawn([&] {
    std::vector<uint8_t> own_scratch;
    std::vector<uint8_t>& scratch = ctx.stage_scratch[1] ? *ctx.stage_scratch[1] : own_scratch;
    try {
      for (int k = 0; k < chunks; ++k) {
        if (!rs_done.wait_for(k)) throw Error(ErrorKind::kRuntime, "hcomm: hier all_reduce: intra-island stage failed");
        auto t0 = clock::now();
        if (engine) engine->wait(up[k]);
        View v = view_of(k);
        const int divide = args.reduce == ReduceOp::kAvg ? flat.size() : 1;
        if (shape.owner) {
          owner_reduce_phase(flat, h, v.target, v.parts, owners_of(k, v.shift), args.reduce, divide, scratch,
                             &inter_bytes);
          inter_s += secs(t0);
          reduced.advance();
          continue;
        }
        if (compressed_inter(h, args))
          inter_island_all_reduce_compressed(flat, h, v.target, v.parts, args.reduce,
                                             // Residuals keyed by buffer length and offset (a
                                             // DDP bucket keeps its length step to step).
                                             (static_cast<int64_t>(buf.count) << 32) + v.shift, &inter_bytes);
        else
          inter_island_all_reduce(flat, h, v.target, v.parts, args.reduce, scratch, &inter_bytes);
        if (divide > 1) kernels::divide_by(v.target.slice(v.mine.begin - v.shift, 0).data, v.mine.size(), buf.dtype, divide);
        inter_s += secs(t0);
        exchanged(k, v);
      }
    } catch (...) {
      x_error = std::current_exception();
      reduced.fail();
      x_done.fail();
    }
  });
  // Owner exchange: the results go back on their own thread, so chunk k's
  // return (mostly the uplink's ingress) overlaps chunk k+1's reduce phase
  // (mostly its egress).
  std::thread return_thread;
  if (shape.owner)
    return_thread = spawn([&] {
      try {
        for (int k = 0; k < chunks; ++k) {
          if (!reduced.wait_for(k)) throw Error(ErrorKind::kRuntime, "hcomm: hier all_reduce: reduce phase failed");
          auto t0 = clock::now();
          View v = view_of(k);
          owner_return_phase(flat, h, v.target, v.parts, owners_of(k, v.shift), &return_bytes);
          return_s += secs(t0);
          exchanged(k, v);
        }
      } catch (...) {
        return_error = std::current_exception();
        x_done.fail();
      }
    });
  std::exception_ptr ag_error;
  try {
    for (int k = 0; k < chunks; ++k) {
      if (!x_done.wait_for(k)) break;
      auto t0 = clock::now();
      if (engine) engine->wait(down[k]);
      auto parts = partitions_of(k);
      Buffer c = buf.slice(chunk_off[k], chunk_counts[k]);
      ring_all_gather_inplace_tagged(intra, c, local_counts(parts[me]), kTagIntraAG);
      ag_s += secs(t0);
    }
  } catch (...) {
    ag_error = std::current_exception();
    rs_done.fail();
    reduced.fail();
    x_done.fail();
  }
  if (rs_thread.joinable()) rs_thread.join();
  if (x_thread.joinable()) x_thread.join();
  if (return_thread.joinable()) return_thread.join();
  // Copies still in flight read or write the host block: let them land
  // before it goes back to the pool, also when a stage failed.
  if (engine)
    for (int k = 0; k < chunks; ++k) engine->wait(up[k]), engine->wait(down[k]);
  // After a failure the transport may still deliver into the block (a
  // receive posted before a peer died): it must never serve another op.
  if (engine && (rs_error || x_error || return_error || ag_error)) new stage::HostBlock(std::move(block));
  if (rs_error) std::rethrow_exception(rs_error);
  if (x_error) std::rethrow_exception(x_error);
  if (return_error) std::rethrow_exception(return_error);
  if (ag_error) std::rethrow_exception(ag_error);
  intra_bytes *= 2;  // the all-gather moves what the reduce-scatter did
  record.tiers.push_back({"intra", intra_bytes, rs_s + ag_s});
  record.tiers.push_back({"inter", inter_bytes + return_bytes, inter_s + return_s});
}

}  // namespace

const Algorithm& hier_all_reduce_algorithm() {
  static const HierAllReduce instance;
  return instance;
}

}  // namespace hcomm
