#include "core/communicator.h"

#include <cmath>
#include <limits>

#include "core/algo/registry.h"
#include "core/algo/ring.h"
#include "core/error.h"
#include "core/validate.h"

namespace hcomm {

namespace {
// The flat transport with every blocking point-to-point wait entered in a
// PeerWatch, so a timeout can name the peers that had not answered.
class WatchedPending final : public Pending {
 public:
  WatchedPending(std::unique_ptr<Pending> inner, std::shared_ptr<PeerWatch> watch, int peer, bool recv)
      : inner_(std::move(inner)), watch_(std::move(watch)), peer_(peer), recv_(recv) {}
  void wait() override {
    watch_->enter(peer_, recv_);
    try {
      inner_->wait();
    } catch (...) {
      watch_->leave(peer_, recv_);
      throw;
    }
    watch_->leave(peer_, recv_);
  }
  int source() const override { return inner_->source(); }

 private:
  std::unique_ptr<Pending> inner_;
  std::shared_ptr<PeerWatch> watch_;
  int peer_;
  bool recv_;
};

class WatchedTransport final : public Transport {
 public:
  WatchedTransport(std::shared_ptr<Transport> inner, std::shared_ptr<PeerWatch> watch)
      : inner_(std::move(inner)), watch_(std::move(watch)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string library() const override { return inner_->library(); }
  bool supports(const CollectiveArgs& args) const override { return inner_->supports(args); }
  void run(const CollectiveArgs& args) override { inner_->run(args); }
  bool start(const CollectiveArgs& args, std::function<void(std::exception_ptr)> done) override {
    return inner_->start(args, std::move(done));
  }
  std::unique_ptr<Pending> isend(const Buffer& buf, int peer, int tag) override {
    return std::make_unique<WatchedPending>(inner_->isend(buf, peer, tag), watch_, peer, false);
  }
  std::unique_ptr<Pending> irecv(const Buffer& buf, int peer, int tag) override {
    return std::make_unique<WatchedPending>(inner_->irecv(buf, peer, tag), watch_, peer, true);
  }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) override { inner_->set_timeout(t); }

 private:
  std::shared_ptr<Transport> inner_;
  std::shared_ptr<PeerWatch> watch_;
};
}  // namespace

Communicator::Communicator(std::shared_ptr<Transport> flat, CommConfig config)
    : watch_(std::make_shared<PeerWatch>()),
      flat_(std::make_shared<WatchedTransport>(std::move(flat), watch_)),
      config_(std::move(config)),
      rank_(flat_->rank()),
      size_(flat_->size()),
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
  const bool p2p = args.kind == OpKind::kSend || args.kind == OpKind::kRecv;
  if (p2p) validate_args(args, rank_, size_);
  const Algorithm* algorithm = nullptr;
  Selection sel;
  if (!p2p) {
    try {
      validate_args(args, rank_, size_);
      // Selected here, on the caller's thread, so "nothing supports this" is
      // raised to the caller before any rank starts communicating.
      sel = plan(args);
    } catch (const std::exception& e) {
      reject(args, e.what());
      throw;
    }
    algorithm = sel.algorithm;
  }
  OpRecord record;
  record.kind = args.kind;
  record.dtype = args.input.dtype;
  record.count = args.input.count;
  record.bytes = args.payload_bytes();
  uint64_t collective_seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record.seq = next_seq_++;
    if (!p2p) collective_seq = next_collective_seq_++;
  }
  if (p2p) {
    record.algorithm = "p2p";
  } else {
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
    if (request) {
      request->set_watch(watch_);
      return request;
    }
    record.tiers.clear();
  }
  auto task = [this, args, hooks = std::move(hooks), algorithm, debug,
               collective_seq](OpRecord& rec) -> std::unique_ptr<Pending> {
    if (debug) debug_check(args, collective_seq, false);
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
      ctx.copy = &copy_;
      ctx.stage_scratch[0] = &stage_scratch_[0];
      ctx.stage_scratch[1] = &stage_scratch_[1];
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
  // Point-to-point ops complete in posting order per (direction, peer, tag);
  // the executor waits each such channel on one thread.
  uint64_t channel = 0;
  if (p2p)
    channel = (uint64_t{args.kind == OpKind::kSend ? 1u : 2u} << 62) |
              (static_cast<uint64_t>(static_cast<uint32_t>(args.peer + 1)) << 32) |
              static_cast<uint32_t>(args.tag);
  auto request = executor_.submit(std::move(task), record, channel);
  request->set_watch(watch_);
  return request;
}

// A collective this rank refuses (bad arguments, nothing can run it) still
// takes its place in the group's sequence.  Under HCOMM_DEBUG it also joins
// the signature exchange, flagged, so that the other ranks, which made a
// valid call and would otherwise wait out the timeout for a peer that never
// comes, raise at once; this rank raises its own, more precise, error.
void Communicator::reject(const CollectiveArgs& args, const std::string& why) {
  uint64_t seq = 0;
  OpRecord record;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record.seq = next_seq_++;
    seq = next_collective_seq_++;
  }
  if (!config_.debug_checks) return;
  record.kind = args.kind;
  record.dtype = args.input.dtype;
  record.count = args.input.count;
  record.algorithm = "rejected";
  auto task = [this, args, seq, why](OpRecord&) -> std::unique_ptr<Pending> {
    try {
      debug_check(args, seq, true);
    } catch (...) {
      // The others raise the mismatch; this rank's record keeps its own reason.
    }
    throw Error(ErrorKind::kInvalidArgument, why);
  };
  try {
    executor_.submit(std::move(task), record);
  } catch (...) {
    // Shut down: there is no exchange to take part in.
  }
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
