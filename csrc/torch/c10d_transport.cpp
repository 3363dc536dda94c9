#include "torch/c10d_transport.h"

#include <thread>

#include "core/error.h"
#include "torch/tensor_util.h"

namespace hcomm {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::kAvg: return c10d::ReduceOp(c10d::ReduceOp::AVG);
    case ReduceOp::kProduct: return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    case ReduceOp::kMin: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case ReduceOp::kMax: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::kBand: return c10d::ReduceOp(c10d::ReduceOp::BAND);
    case ReduceOp::kBor: return c10d::ReduceOp(c10d::ReduceOp::BOR);
    case ReduceOp::kBxor: return c10d::ReduceOp(c10d::ReduceOp::BXOR);
    default: return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
}

// Runs `fn` and turns a library failure into an hcomm Error that names the
// library, the op and this rank (gloo's own text says which peer and why).
template <typename F>
void guarded(const std::string& library, int rank, const std::string& what, F fn) {
  try {
    fn();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    const bool timeout = msg.find("imed out") != std::string::npos || msg.find("imeout") != std::string::npos;
    throw Error(timeout ? ErrorKind::kTimeout : ErrorKind::kRuntime,
                "hcomm: " + library + " " + what + " failed on rank " + std::to_string(rank) + ": " + msg);
  }
}

class WorkPending final : public Pending {
 public:
  // `what`: "recv from rank 3 (tag 5)", so a failure names the peer.
  WorkPending(c10::intrusive_ptr<c10d::Work> work, std::string library, int rank, std::string what,
              std::chrono::milliseconds timeout)
      : work_(std::move(work)), library_(std::move(library)), rank_(rank), what_(std::move(what)), timeout_(timeout) {}
  void wait() override {
    // Explicit: gloo's p2p waits otherwise use the timeout its context was created with.
    bool done = true;
    guarded(library_, rank_, what_, [&] { done = work_->wait(timeout_); });
    if (!done)
      throw Error(ErrorKind::kTimeout, "hcomm: " + library_ + " " + what_ + " on rank " + std::to_string(rank_) +
                                           " timed out after " + std::to_string(timeout_.count()) + " ms");
    source_ = what_[0] == 'r' ? work_->sourceRank() : -1;
  }
  int source() const override { return source_; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string library_;
  int rank_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  int source_ = -1;
};

// A bool SUM in gloo adds the bytes: True on 3 ranks comes back as byte 3,
// which compares equal as a bool but is not one in memory (views, hashing,
// serialisation would see it), and hcomm's own kernels give 1.  Fold it back.
std::function<void()> canonical_bools(const CollectiveArgs& a) {
  const bool reduces = a.kind == OpKind::kAllReduce || a.kind == OpKind::kReduce || a.kind == OpKind::kReduceScatter;
  if (!reduces || a.output.dtype != DType::kBool || a.reduce != ReduceOp::kSum || a.output.count == 0) return nullptr;
  Buffer out = a.output;
  return [out] { from_buffer(out).view(at::kByte).clamp_max_(1); };
}

// gloo cannot receive an empty message from any source ("offset <
// this->size. 0 vs 0", and the sender then waits out the timeout), so every
// empty message travels as one byte: senders and receivers agree on it
// without knowing how the other side was posted.
at::Tensor wire_tensor(const Buffer& buf) {
  if (buf.bytes() == 0) return at::zeros({1}, at::kByte);
  return bytes_view(buf);
}

// The tag a message travels under: tags below 2^20 (hcomm's algorithms use
// kAlgoTag + small numbers; user tags are usually small) carry 11 bits of a
// hash of the message's byte count in bits 20-30.  A receive posted for a
// different size than was sent then never matches it: gloo would abort the
// whole process when the message is longer than the buffer (EnforceNotMet
// on its IO thread) and silently fill part of it when it is shorter, where
// now both ranks fail by the group's timeout, naming the peer.  Ranks that
// disagree on a count are a caller's bug; HCOMM_DEBUG=1 names it at once.
int wire_tag(int tag, size_t bytes) {
  if (tag < 0 || tag >= (1 << 20)) return tag;
  const uint64_t h = static_cast<uint64_t>(bytes) * 0x9E3779B97F4A7C15ull;
  return tag | static_cast<int>((h >> 53) << 20);
}

}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::Backend> backend, std::chrono::milliseconds timeout)
    : backend_(std::move(backend)), timeout_ms_(timeout.count()), rank_(backend_->getRank()), size_(backend_->getSize()),
      library_(backend_->getBackendName()) {}

// What torch's gloo reduces itself (probed on torch 2.13): every dtype but
// int16, uint16 and fp8; bitwise ops only on integers; avg only on floats.
bool C10dTransport::reduces_natively(DType dtype, ReduceOp op) const {
  if (!reduce_supported(dtype, op)) return false;
  if (dtype == DType::kInt16 || dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2) return false;
  if (op == ReduceOp::kAvg && !is_floating(dtype)) return false;
  if (library_ == "nccl" && (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor)) return false;
  if (dtype == DType::kBool && library_ != "gloo") return false;
  return true;
}

bool C10dTransport::supports(const CollectiveArgs& a) const {
  switch (a.kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduce:
    case OpKind::kReduceScatter: return reduces_natively(a.input.dtype, a.reduce);
    case OpKind::kBroadcast:
    case OpKind::kAllGather:
    case OpKind::kAllToAll:
    case OpKind::kAllToAllV:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kBarrier: return true;
    default: return false;  // the _v gathers/scatters run as hcomm rings
  }
}

c10::intrusive_ptr<c10d::Work> C10dTransport::issue(const CollectiveArgs& a) {
  const int64_t n = size_;
  c10::intrusive_ptr<c10d::Work> work;
  guarded(library_, rank_, op_name(a.kind), [&] {
    switch (a.kind) {
      case OpKind::kAllReduce: {
        std::vector<at::Tensor> ts{from_buffer(a.input)};
        c10d::AllreduceOptions o;
        o.reduceOp = to_c10d(a.reduce);
        o.timeout = timeout();
        work = backend_->allreduce(ts, o);
        break;
      }
      case OpKind::kReduce: {
        std::vector<at::Tensor> ts{from_buffer(a.input)};
        c10d::ReduceOptions o;
        o.reduceOp = to_c10d(a.reduce);
        o.rootRank = a.root;
        o.timeout = timeout();
        work = backend_->reduce(ts, o);
        break;
      }
      case OpKind::kReduceScatter: {
        at::Tensor out = from_buffer(a.output), in = from_buffer(a.input);
        c10d::ReduceScatterOptions o;
        o.reduceOp = to_c10d(a.reduce);
        o.timeout = timeout();
        work = backend_->_reduce_scatter_base(out, in, o);
        break;
      }
      case OpKind::kBroadcast: {
        std::vector<at::Tensor> ts{bytes_view(a.input)};
        c10d::BroadcastOptions o;
        o.rootRank = a.root;
        o.timeout = timeout();
        work = backend_->broadcast(ts, o);
        break;
      }
      case OpKind::kAllGather: {
        at::Tensor out = bytes_view(a.output), in = bytes_view(a.input);
        c10d::AllgatherOptions o;
        o.timeout = timeout();
        work = backend_->_allgather_base(out, in, o);
        break;
      }
      case OpKind::kAllToAll:
      case OpKind::kAllToAllV: {
        at::Tensor out = bytes_view(a.output), in = bytes_view(a.input);
        std::vector<int64_t> send = a.input_counts, recv = a.output_counts;
        c10d::AllToAllOptions o;
        o.timeout = timeout();
        work = backend_->alltoall_base(out, in, recv, send, o);
        break;
      }
      case OpKind::kGather: {
        std::vector<at::Tensor> in{bytes_view(a.input)};
        std::vector<std::vector<at::Tensor>> out(1);
        if (rank_ == a.root)
          for (int64_t i = 0; i < n; ++i) out[0].push_back(bytes_view(a.output.slice(i * a.input.count, a.input.count)));
        else
          out.clear();
        c10d::GatherOptions o;
        o.rootRank = a.root;
        o.timeout = timeout();
        work = backend_->gather(out, in, o);
        break;
      }
      case OpKind::kScatter: {
        std::vector<at::Tensor> out{bytes_view(a.output)};
        std::vector<std::vector<at::Tensor>> in(1);
        if (rank_ == a.root)
          for (int64_t i = 0; i < n; ++i) in[0].push_back(bytes_view(a.input.slice(i * a.output.count, a.output.count)));
        else
          in.clear();
        c10d::ScatterOptions o;
        o.rootRank = a.root;
        o.timeout = timeout();
        work = backend_->scatter(out, in, o);
        break;
      }
      case OpKind::kBarrier: {
        c10d::BarrierOptions o;
        o.timeout = timeout();
        work = backend_->barrier(o);
        break;
      }
      default: throw Error(ErrorKind::kInvalidArgument, library_ + " has no native " + a.describe());
    }
  });
  return work;
}

void C10dTransport::run(const CollectiveArgs& a) {
  auto work = issue(a);
  guarded(library_, rank_, op_name(a.kind), [&] { work->wait(timeout()); });
  if (auto fix = canonical_bools(a)) fix();
}

bool C10dTransport::start(const CollectiveArgs& a, std::function<void(std::exception_ptr)> done) {
  // torch 2.13's gloo returns a Work without a future from
  // _reduce_scatter_base ("Work::getFuture not implemented"): decline before
  // issuing anything, so the op takes the worker path and waits there.
  if (library_ == "gloo" && a.kind == OpKind::kReduceScatter) return false;
  auto work = issue(a);
  if (auto fix = canonical_bools(a)) {
    done = [fix, done = std::move(done)](std::exception_ptr error) {
      if (!error) fix();
      done(error);
    };
  }
  std::string library = library_;
  const int rank = rank_;
  const char* what = op_name(a.kind);
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const c10::Error&) {
    // Another library's Work without a future: the op is already issued, so
    // wait for it on a thread of its own rather than block the caller.
    std::thread([work, done = std::move(done), library, rank, what, timeout = timeout()] {
      std::exception_ptr error;
      try {
        guarded(library, rank, what, [&] { work->wait(timeout); });
      } catch (...) {
        error = std::current_exception();
      }
      done(error);
    }).detach();
    return true;
  }
  // The callback runs on the library's thread when the op completes; the
  // Work is captured so it outlives the op.
  future->addCallback([work, done = std::move(done), library, rank, what](c10::ivalue::Future& f) {
    std::exception_ptr error;
    if (f.hasError()) {
      try {
        guarded(library, rank, what, [&] { std::rethrow_exception(f.exception_ptr()); });
      } catch (...) {
        error = std::current_exception();
      }
    }
    done(error);
  });
  return true;
}

std::unique_ptr<Pending> C10dTransport::isend(const Buffer& buf, int peer, int tag) {
  std::vector<at::Tensor> ts{wire_tensor(buf)};
  c10::intrusive_ptr<c10d::Work> work;
  guarded(library_, rank_, "send", [&] { work = backend_->send(ts, peer, wire_tag(tag, buf.bytes())); });
  return std::make_unique<WorkPending>(std::move(work), library_, rank_,
                                       "send to rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")",
                                       timeout());
}

std::unique_ptr<Pending> C10dTransport::irecv(const Buffer& buf, int peer, int tag) {
  std::vector<at::Tensor> ts{wire_tensor(buf)};
  c10::intrusive_ptr<c10d::Work> work;
  guarded(library_, rank_, "recv", [&] {
    const int wtag = wire_tag(tag, buf.bytes());
    work = peer < 0 ? backend_->recvAnysource(ts, wtag) : backend_->recv(ts, peer, wtag);
  });
  return std::make_unique<WorkPending>(
      std::move(work), library_, rank_,
      (peer < 0 ? std::string("recv from any rank") : "recv from rank " + std::to_string(peer)) + " (tag " +
          std::to_string(tag) + ")",
      timeout());
}

}  // namespace hcomm
