#include "core/communicator.h"

#include <cmath>
#include <limits>

#include "core/algo/registry.h"
#include "core/algo/ring.h"
#include "core/error.h"
#include "core/validate.h"

namespace hcomm {

Communicator::Communicator(std::shared_ptr<Transport> flat, CommConfig config)
    : flat_(std::move(flat)), config_(std::move(config)), rank_(flat_->rank()), size_(flat_->size()),
      library_(flat_->library()) {
  // Recorded before the request completes, so history() after wait() sees it.
  executor_.set_recorder([this](const OpRecord& record) { remember(record); });
}

Communicator::~Communicator() { shutdown(); }

void Communicator::shutdown() { executor_.shutdown(); }

AlgoContext Communicator::context() const {
  AlgoContext ctx;
  ctx.flat = flat_.get();
  std::lock_guard<std::mutex> lock(mu_);
  ctx.flat_link = config_.flat_link;
  ctx.hierarchy = hierarchy_.get();
  return ctx;
}

Selection Communicator::plan(const CollectiveArgs& args) const {
  return select_algorithm(args, context(), forced_algorithm());
}

void Communicator::set_hierarchy(std::shared_ptr<const Hierarchy> hierarchy) {
  if (hierarchy) {
    HCOMM_CHECK_ARG(static_cast<int>(hierarchy->island_of.size()) == size_ &&
                        static_cast<int>(hierarchy->local_index.size()) == size_,
                    "hcomm: hierarchy describes " + std::to_string(hierarchy->island_of.size()) +
                        " ranks but the group has " + std::to_string(size_));
    const int mine = hierarchy->island_of[rank_];
    HCOMM_CHECK_ARG(hierarchy->intra && hierarchy->intra->size() == static_cast<int>(hierarchy->islands[mine].size()),
                    "hcomm: the island transport's size does not match this rank's island");
  }
  std::lock_guard<std::mutex> lock(mu_);
  hierarchy_ = std::move(hierarchy);
}

std::shared_ptr<const Hierarchy> Communicator::hierarchy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hierarchy_;
}

double Communicator::predict(const CollectiveArgs& args, const std::string& algorithm) const {
  const Algorithm* a = find_algorithm(algorithm);
  AlgoContext ctx = context();
  if (a == nullptr || !a->supports(args, ctx, nullptr)) return std::numeric_limits<double>::quiet_NaN();
  return a->cost(args, ctx);
}

std::shared_ptr<Request> Communicator::submit(CollectiveArgs args, OpHooks hooks) {
  validate_args(args, rank_, size_);
  OpRecord record;
  record.kind = args.kind;
  record.dtype = args.input.dtype;
  record.count = args.input.count;
  record.bytes = args.payload_bytes();
  const bool p2p = args.kind == OpKind::kSend || args.kind == OpKind::kRecv;
  uint64_t collective_seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record.seq = next_seq_++;
    if (!p2p) collective_seq = next_collective_seq_++;
  }
  const Algorithm* algorithm = nullptr;
  if (p2p) {
    record.algorithm = "p2p";
  } else {
    // Selected here, on the caller's thread, so "nothing supports this" is
    // raised to the caller before any rank starts communicating.
    Selection sel = plan(args);
    algorithm = sel.algorithm;
    record.algorithm = algorithm->name();
    record.predicted_seconds = sel.predicted_seconds;
  }
  bool debug = config_.debug_checks && !p2p;
  if (!p2p && !debug && !hooks.before && algorithm == &native_algorithm()) {
    // Fast path: a lone native op goes straight to the library.
    auto after = hooks.after;
    Transport* flat = flat_.get();
    record.tiers.push_back({"flat", args.payload_bytes(), 0});
    auto request = executor_.try_direct(
        [&](std::function<void(std::exception_ptr)> done) {
          return flat->start(args, [after, done](std::exception_ptr error) {
            if (!error && after) {
              try {
                after();
              } catch (...) {
                error = std::current_exception();
              }
            }
            done(error);
          });
        },
        record);
    if (request) return request;
    record.tiers.clear();
  }
  auto task = [this, args, hooks = std::move(hooks), algorithm, debug,
               collective_seq](OpRecord& rec) -> std::unique_ptr<Pending> {
    if (debug) debug_check(args, collective_seq);
    if (hooks.before) hooks.before();
    std::unique_ptr<Pending> pending;
    if (args.kind == OpKind::kSend) {
      pending = flat_->isend(args.input, args.peer, args.tag);
      rec.tiers.push_back({"flat", args.input.bytes(), 0});
    } else if (args.kind == OpKind::kRecv) {
      pending = flat_->irecv(args.output, args.peer, args.tag);
    } else {
      // Hold the hierarchy for the op's duration even if it is replaced.
      auto hierarchy = this->hierarchy();
      AlgoContext ctx = context();
      ctx.hierarchy = hierarchy.get();
      ctx.scratch = &scratch_;
      algorithm->run(args, ctx, rec);
    }
    if (pending && hooks.after) {
      // Run the after-hook once the message is done, off the worker.
      struct Chained : Pending {
        std::unique_ptr<Pending> inner;
        std::function<void()> after;
        void wait() override {
          inner->wait();
          after();
        }
        int source() const override { return inner->source(); }
      };
      auto chained = std::make_unique<Chained>();
      chained->inner = std::move(pending);
      chained->after = hooks.after;
      pending = std::move(chained);
    } else if (hooks.after) {
      hooks.after();
    }
    return pending;
  };
  return executor_.submit(std::move(task), record);
}

void Communicator::remember(const OpRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  history_.push_back(record);
  while (history_.size() > config_.history_limit) history_.pop_front();
}

std::vector<OpRecord> Communicator::history() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<OpRecord>(history_.begin(), history_.end());
}

void Communicator::clear_history() {
  std::lock_guard<std::mutex> lock(mu_);
  history_.clear();
}

void Communicator::set_forced_algorithm(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  config_.forced_algorithm = name;
}

std::string Communicator::forced_algorithm() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_.forced_algorithm;
}

void Communicator::set_link_model(const LinkModel& link) {
  std::lock_guard<std::mutex> lock(mu_);
  config_.flat_link = link;
}

// HCOMM_DEBUG: every rank all-gathers a small signature of the op it is about
// to run; a rank whose call differs is named before the mismatched collective
// can hang or corrupt data.
void Communicator::debug_check(const CollectiveArgs& a, uint64_t seq) {
  auto counts_hash = [](const std::vector<int64_t>& c) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : c) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<int64_t>(h);
  };
  int64_t count = a.input.count, shape = a.shape_hash;
  switch (a.kind) {
    case OpKind::kAllGatherV: count = a.output.count; shape = counts_hash(a.output_counts); break;
    case OpKind::kReduceScatterV: count = a.input.count; shape = counts_hash(a.input_counts); break;
    case OpKind::kReduceScatter: count = a.output.count; break;
    case OpKind::kAllToAllV: count = 0; break;
    case OpKind::kScatter: count = a.output.count; break;
    case OpKind::kBarrier: count = 0; break;
    default: break;
  }
  const int64_t mine[6] = {static_cast<int64_t>(seq), static_cast<int64_t>(a.kind), static_cast<int64_t>(a.input.dtype),
                           count, a.is_reduction() ? static_cast<int64_t>(a.reduce) * 1000 + a.root : a.root, shape};
  std::vector<int64_t> all(6 * static_cast<size_t>(size_));
  for (int i = 0; i < 6; ++i) all[rank_ * 6 + i] = mine[i];
  Buffer out{all.data(), static_cast<int64_t>(all.size()), DType::kInt64};
  ring_all_gather_inplace(*flat_, out, std::vector<int64_t>(size_, 6));
  static const char* fields[] = {"sequence number", "op", "dtype", "element count", "reduce op/root",
                                 "shape or split sizes"};
  auto show = [&](int i, int64_t v) -> std::string {
    if (i == 1) return op_name(static_cast<OpKind>(v));
    if (i == 2) return dtype_name(static_cast<DType>(v));
    return std::to_string(v);
  };
  for (int i = 0; i < 6; ++i) {
    // The value most ranks hold (ties: the lowest rank's) is the reference, so
    // every rank, the odd one included, names the same disagreeing rank.
    int best_rank = 0, best_votes = 0;
    for (int r = 0; r < size_; ++r) {
      int votes = 0;
      for (int q = 0; q < size_; ++q) votes += all[q * 6 + i] == all[r * 6 + i];
      if (votes > best_votes) best_rank = r, best_votes = votes;
    }
    const int64_t expected = all[best_rank * 6 + i];
    for (int r = 0; r < size_; ++r) {
      if (all[r * 6 + i] == expected) continue;
      throw Error(ErrorKind::kRuntime, "hcomm (HCOMM_DEBUG): collective mismatch seen on rank " +
                                           std::to_string(rank_) + " (running " + a.describe() + "): rank " +
                                           std::to_string(r) + " disagrees on " + fields[i] + " (" +
                                           show(i, all[r * 6 + i]) + " vs " + show(i, expected) + " on rank " +
                                           std::to_string(best_rank) + ")");
    }
  }
  if (a.kind == OpKind::kAllToAllV) debug_check_splits(a);
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

namespace {
CollectiveArgs make(OpKind kind, Buffer in, Buffer out) {
  CollectiveArgs a;
  a.kind = kind;
  a.input = in;
  a.output = out;
  return a;
}
}  // namespace

std::shared_ptr<Request> Communicator::all_reduce(Buffer buf, ReduceOp op, OpHooks h) {
  auto a = make(OpKind::kAllReduce, buf, buf);
  a.reduce = op;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::reduce(Buffer buf, ReduceOp op, int root, OpHooks h) {
  auto a = make(OpKind::kReduce, buf, buf);
  a.reduce = op;
  a.root = root;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::broadcast(Buffer buf, int root, OpHooks h) {
  auto a = make(OpKind::kBroadcast, buf, buf);
  a.root = root;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::all_gather(Buffer in, Buffer out, OpHooks h) {
  return submit(make(OpKind::kAllGather, in, out), std::move(h));
}
std::shared_ptr<Request> Communicator::all_gather_v(Buffer in, Buffer out, std::vector<int64_t> counts, OpHooks h) {
  auto a = make(OpKind::kAllGatherV, in, out);
  a.output_counts = std::move(counts);
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::reduce_scatter(Buffer in, Buffer out, ReduceOp op, OpHooks h) {
  auto a = make(OpKind::kReduceScatter, in, out);
  a.reduce = op;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::reduce_scatter_v(Buffer in, Buffer out, std::vector<int64_t> counts,
                                                        ReduceOp op, OpHooks h) {
  auto a = make(OpKind::kReduceScatterV, in, out);
  a.input_counts = std::move(counts);
  a.reduce = op;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::all_to_all(Buffer in, Buffer out, OpHooks h) {
  return submit(make(OpKind::kAllToAll, in, out), std::move(h));
}
std::shared_ptr<Request> Communicator::all_to_all_v(Buffer in, Buffer out, std::vector<int64_t> send_counts,
                                                    std::vector<int64_t> recv_counts, OpHooks h) {
  auto a = make(OpKind::kAllToAllV, in, out);
  a.input_counts = std::move(send_counts);
  a.output_counts = std::move(recv_counts);
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::gather(Buffer in, Buffer out, int root, OpHooks h) {
  auto a = make(OpKind::kGather, in, out);
  a.root = root;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::scatter(Buffer in, Buffer out, int root, OpHooks h) {
  auto a = make(OpKind::kScatter, in, out);
  a.root = root;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::send(Buffer buf, int peer, int tag, OpHooks h) {
  auto a = make(OpKind::kSend, buf, buf);
  a.peer = peer;
  a.tag = tag;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::recv(Buffer buf, int peer, int tag, OpHooks h) {
  auto a = make(OpKind::kRecv, buf, buf);
  a.peer = peer;
  a.tag = tag;
  return submit(std::move(a), std::move(h));
}
std::shared_ptr<Request> Communicator::barrier(OpHooks h) {
  return submit(make(OpKind::kBarrier, Buffer{}, Buffer{}), std::move(h));
}

}  // namespace hcomm
