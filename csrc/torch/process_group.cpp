// ProcessGroupHComm: plumbing, reductions, broadcast, point-to-point, barrier.
// The gather/scatter family is in process_group_gather.cpp.
#include "torch/process_group.h"

#include <c10/util/Exception.h>

#include "core/error.h"
#include "core/stage/copy_engine.h"
#include "torch/c10d_transport.h"
#include "torch/tensor_util.h"

namespace hcomm {

void check_single(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "hcomm: ", op, " takes exactly one tensor per call, got ", tensors.size());
}

void check_dense(const at::Tensor& t, const char* op, const char* what) {
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "hcomm: ", op, ": ", what, " must be a dense tensor, got layout ",
                    t.layout());
  to_hcomm_dtype(t.scalar_type());  // raises naming the dtype
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), "hcomm: ", op, ": input dtype ", a.scalar_type(),
                    " differs from output dtype ", b.scalar_type());
}

ProcessGroupHComm::ProcessGroupHComm(const c10::intrusive_ptr<c10d::Store>&, int rank, int size,
                                     std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> host_backend,
                                     c10::intrusive_ptr<c10d::Backend> device_backend, CommConfig config)
    : c10d::Backend(rank, size),
      host_backend_(std::move(host_backend)),
      device_backend_(std::move(device_backend)),
      timeout_(timeout) {
  TORCH_CHECK_VALUE(host_backend_, "hcomm: a host backend (gloo) is required");
  TORCH_CHECK_VALUE(host_backend_->getRank() == rank && host_backend_->getSize() == size,
                    "hcomm: host backend is rank ", host_backend_->getRank(), " of ", host_backend_->getSize(),
                    ", expected rank ", rank, " of ", size);
  transport_ = std::make_shared<C10dTransport>(host_backend_, timeout);
  comm_ = std::make_unique<Communicator>(transport_, std::move(config));
}

void ProcessGroupHComm::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  host_backend_->setTimeout(timeout);
  transport_->set_timeout(timeout);
  if (island_backend_) island_backend_->setTimeout(timeout);
  if (auto h = comm_->hierarchy())
    h->intra->set_timeout(timeout);
}

ProcessGroupHComm::~ProcessGroupHComm() {
  if (comm_) comm_->shutdown();
}

void ProcessGroupHComm::set_hierarchy(std::vector<std::vector<int>> islands,
                                      c10::intrusive_ptr<c10d::Backend> island_backend, LinkModel intra,
                                      LinkModel inter, std::vector<double> weights, bool proportional,
                                      std::vector<int> uplink_sharing,
                                      std::shared_ptr<Transport> intra_transport, std::vector<double> island_betas,
                                      Hierarchy::Exchange exchange) {
  auto h = std::make_shared<Hierarchy>();
  h->island_of.assign(getSize(), -1);
  h->local_index.assign(getSize(), -1);
  for (size_t i = 0; i < islands.size(); ++i)
    for (size_t j = 0; j < islands[i].size(); ++j) {
      const int r = islands[i][j];
      TORCH_CHECK_VALUE(r >= 0 && r < getSize() && h->island_of[r] == -1, "hcomm: islands must partition ranks 0..",
                        getSize() - 1, "; rank ", r, " is out of range or repeated");
      h->island_of[r] = static_cast<int>(i);
      h->local_index[r] = static_cast<int>(j);
    }
  for (int r = 0; r < getSize(); ++r) TORCH_CHECK_VALUE(h->island_of[r] >= 0, "hcomm: rank ", r, " is in no island");
  h->islands = std::move(islands);
  island_backend_ = island_backend;
  // The island's own transport when one was built for it (shared memory on
  // one host), else its vendor library through c10d.
  h->intra = intra_transport ? intra_transport
                             : std::shared_ptr<Transport>(std::make_shared<C10dTransport>(island_backend, timeout_));
  h->intra_link = intra;
  h->inter_link = inter;
  h->inter_weight = std::move(weights);
  h->proportional = proportional;
  h->uplink_sharing = std::move(uplink_sharing);
  // Measured per-island uplinks; a list of the wrong length (or with a
  // zero) means "unknown" and the inter tier's beta serves every island.
  bool uplinks_ok = island_betas.size() == h->islands.size();
  for (double b : island_betas) uplinks_ok = uplinks_ok && b > 0;
  if (uplinks_ok) h->island_beta = std::move(island_betas);
  h->exchange = exchange;
  // A flat algorithm on this group runs at its slowest tier.
  comm_->set_link_model(inter);
  try {
    comm_->set_hierarchy(std::move(h));
  } catch (...) {
    rethrow_for_torch(std::current_exception());
  }
}

void ProcessGroupHComm::set_compression(std::optional<DType> wire, int64_t chunk, bool error_feedback) {
  // A group of one island has no weak tier: the policy has nothing to act on
  // there, which is not an error (the same script runs on one host and on
  // many; torchrun --standalone gives one island).
  auto current = comm_->hierarchy();
  if (!current) return;
  auto h = std::make_shared<Hierarchy>(*current);
  h->compress = wire.has_value();
  if (wire) {
    h->wire.wire = *wire;
    h->wire.chunk = chunk;
    try {
      compress::wire_supported(h->wire, true);
    } catch (...) {
      rethrow_for_torch(std::current_exception());
    }
  }
  h->error_feedback = error_feedback;
  if (!h->residuals) h->residuals = std::make_shared<compress::ResidualStore>();
  comm_->set_hierarchy(std::move(h));
}

void ProcessGroupHComm::set_staging(bool force, int64_t chunk_bytes, double copy_alpha, double copy_beta) {
  TORCH_CHECK_VALUE(chunk_bytes >= 0, "hcomm: the bridge chunk must be >= 0 bytes, got ", chunk_bytes);
  auto current = comm_->hierarchy();
  if (!current) return;  // one island: nothing crosses a bridge
  auto h = std::make_shared<Hierarchy>(*current);
  h->staging = force ? stage::emulated_engine()
                     : (device_backend_ ? stage::engine_for(DeviceKind::kCUDA) : nullptr);
  // Every rank must cut bridged messages alike.  Only the staging mode
  // (set on every rank) bridges today: device tensors stay on the device
  // backend (hier_applies), and a cluster mixing device and CPU islands will
  // need the topology exchange to say which ranks stage.
  h->bridge_chunk_bytes = force ? static_cast<size_t>(chunk_bytes) : 0;
  h->stage_link.alpha = copy_alpha;
  h->stage_link.beta = copy_beta;
  comm_->set_hierarchy(std::move(h));
}

bool ProcessGroupHComm::on_device(const char* op, const std::vector<at::Tensor>& tensors) const {
  const at::Tensor* device = nullptr;
  bool host = false;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (t.device().is_cpu()) {
      host = true;
    } else if (!device) {
      device = &t;
    } else {
      TORCH_CHECK_VALUE(t.device() == device->device(), "hcomm: ", op, " on rank ", getRank(), ": tensors on ",
                        device->device(), " and ", t.device(), " in one call; put them on one device");
    }
  }
  if (!device) return false;
  TORCH_CHECK_VALUE(!host, "hcomm: ", op, " on rank ", getRank(), ": tensors on cpu and ", device->device(),
                    " in one call; put them on one device");
  TORCH_CHECK_VALUE(device_backend_, "hcomm: ", op, " on rank ", getRank(), ": tensor on ", device->device(),
                    " but this group has no backend for it (hcomm was built without CUDA, or ",
                    device->device().type() == at::kCUDA ? "no GPU or NCCL was found when the group was created)"
                                                           : "no vendor library for that device is wired in)");
  return true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::run(CollectiveArgs args, c10d::OpType type,
                                                      std::vector<at::Tensor> keep, std::function<void()> after,
                                                      std::vector<at::Tensor> outputs, const char* title) {
  OpHooks hooks;
  // The hook owns the tensors: they live until the op is done with them.
  hooks.after = [keep = std::move(keep), after = std::move(after)]() {
    if (after) after();
  };
  std::shared_ptr<Request> req;
  try {
    req = comm_->submit(std::move(args), std::move(hooks));
  } catch (...) {
    rethrow_for_torch(std::current_exception());
  }
  if (coalescing_) coalesced_.push_back(req);
  return c10::make_intrusive<HCommWork>(std::vector<std::shared_ptr<Request>>{req}, type, std::move(outputs), timeout_,
                                        getRank(), title);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::join(std::vector<c10::intrusive_ptr<c10d::Work>> works,
                                                       c10d::OpType type, std::vector<at::Tensor> outputs) {
  std::vector<std::shared_ptr<Request>> reqs;
  for (auto& w : works) {
    auto* hw = dynamic_cast<HCommWork*>(w.get());
    for (auto& r : hw->requests()) reqs.push_back(r);
  }
  return c10::make_intrusive<HCommWork>(std::move(reqs), type, std::move(outputs), timeout_, getRank(), "hcomm:coalesced");
}

void ProcessGroupHComm::startCoalescing() {
  TORCH_CHECK_VALUE(!coalescing_, "hcomm: startCoalescing called twice without endCoalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::endCoalescing() {
  TORCH_CHECK_VALUE(coalescing_, "hcomm: endCoalescing without startCoalescing");
  coalescing_ = false;
  auto reqs = std::move(coalesced_);
  coalesced_.clear();
  return c10::make_intrusive<HCommWork>(std::move(reqs), c10d::OpType::COALESCED, std::vector<at::Tensor>{}, timeout_,
                                        getRank(), "hcomm:coalesced");
}

// In-place ops on a tensor that may be strided: run on a contiguous copy and
// copy the result back on the worker when the op is done.
namespace {
struct InPlace {
  at::Tensor user, work;
  explicit InPlace(const at::Tensor& t) : user(t), work(t.contiguous()) {}
  bool copied() const { return !work.is_same(user); }
  std::function<void()> copy_back() const {
    if (!copied()) return nullptr;
    at::Tensor u = user, w = work;
    return [u, w]() mutable { u.copy_(w); };
  }
};
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  if (on_device("broadcast", tensors)) return device_backend_->broadcast(tensors, opts);
  checked(*comm_, OpKind::kBroadcast, [&] {
    check_single(tensors, "broadcast");
    check_dense(tensors[0], "broadcast", "tensor");
  });
  InPlace t(tensors[0]);
  CollectiveArgs a;
  a.kind = OpKind::kBroadcast;
  a.input = a.output = to_buffer(t.work);
  a.shape = shape_of(t.user);
  a.root = static_cast<int>(opts.rootRank);
  return run(std::move(a), c10d::OpType::BROADCAST, {t.work, t.user}, t.copy_back(), tensors, "hcomm:broadcast");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  if (on_device("all_reduce", tensors)) return device_backend_->allreduce(tensors, opts);
  checked(*comm_, OpKind::kAllReduce, [&] {
    check_single(tensors, "allreduce");
    check_dense(tensors[0], "allreduce", "tensor");
  });
  InPlace t(tensors[0]);
  CollectiveArgs a;
  a.kind = OpKind::kAllReduce;
  a.input = a.output = to_buffer(t.work);
  a.shape = shape_of(t.user);
  a.reduce = to_hcomm_op(opts.reduceOp, t.work.scalar_type());
  return run(std::move(a), c10d::OpType::ALLREDUCE, {t.work, t.user}, t.copy_back(), tensors, "hcomm:all_reduce");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  if (on_device("all_reduce_coalesced", tensors)) return device_backend_->allreduce_coalesced(tensors, opts);
  TORCH_CHECK_VALUE(!tensors.empty(), "hcomm: allreduce_coalesced needs at least one tensor");
  bool uniform = true;
  for (auto& t : tensors) {
    check_dense(t, "allreduce_coalesced", "tensor");
    uniform = uniform && t.scalar_type() == tensors[0].scalar_type();
  }
  if (!uniform) {  // one op per tensor, joined into one Work
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      c10d::AllreduceOptions o;
      o.reduceOp = opts.reduceOp;
      works.push_back(allreduce(one, o));
    }
    return join(std::move(works), c10d::OpType::ALLREDUCE_COALESCED, tensors);
  }
  // One flat buffer: one collective instead of many small ones.
  std::vector<at::Tensor> flat_parts;
  for (auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flat_parts);
  CollectiveArgs a;
  a.kind = OpKind::kAllReduce;
  a.input = a.output = to_buffer(flat);
  a.reduce = to_hcomm_op(opts.reduceOp, flat.scalar_type());
  std::vector<at::Tensor> users = tensors;
  auto after = [flat, users]() mutable {
    int64_t off = 0;
    for (auto& u : users) {
      u.copy_(flat.narrow(0, off, u.numel()).view(u.sizes()));
      off += u.numel();
    }
  };
  std::vector<at::Tensor> keep = tensors;
  keep.push_back(flat);
  return run(std::move(a), c10d::OpType::ALLREDUCE_COALESCED, keep, after, tensors, "hcomm:all_reduce_coalesced");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  if (on_device("reduce", tensors)) return device_backend_->reduce(tensors, opts);
  checked(*comm_, OpKind::kReduce, [&] {
    check_single(tensors, "reduce");
    check_dense(tensors[0], "reduce", "tensor");
  });
  const int root = static_cast<int>(opts.rootRank);
  // Non-root ranks reduce a copy, so their input is left as it was.
  at::Tensor user = tensors[0];
  at::Tensor work = (getRank() == root) ? user.contiguous() : user.contiguous().clone();
  std::function<void()> after;
  if (getRank() == root && !work.is_same(user)) after = [user, work]() mutable { user.copy_(work); };
  CollectiveArgs a;
  a.kind = OpKind::kReduce;
  a.input = a.output = to_buffer(work);
  a.shape = shape_of(user);
  a.reduce = to_hcomm_op(opts.reduceOp, work.scalar_type());
  a.root = root;
  return run(std::move(a), c10d::OpType::REDUCE, {work, user}, after, tensors, "hcomm:reduce");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  if (on_device("send", tensors)) return device_backend_->send(tensors, dstRank, tag);
  check_single(tensors, "send");
  check_dense(tensors[0], "send", "tensor");
  at::Tensor t = tensors[0].contiguous();
  CollectiveArgs a;
  a.kind = OpKind::kSend;
  a.input = a.output = to_buffer(t);
  a.peer = dstRank;
  a.tag = tag;
  return run(std::move(a), c10d::OpType::SEND, {t}, nullptr, {}, "hcomm:send");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  if (on_device("recv", tensors)) return device_backend_->recv(tensors, srcRank, tag);
  check_single(tensors, "recv");
  check_dense(tensors[0], "recv", "tensor");
  InPlace t(tensors[0]);
  CollectiveArgs a;
  a.kind = OpKind::kRecv;
  a.input = a.output = to_buffer(t.work);
  a.peer = srcRank;
  a.tag = tag;
  return run(std::move(a), srcRank < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, {t.work, t.user},
             t.copy_back(), tensors, "hcomm:recv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return recv(tensors, -1, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::barrier(const c10d::BarrierOptions&) {
  CollectiveArgs a;
  a.kind = OpKind::kBarrier;
  return run(std::move(a), c10d::OpType::BARRIER, {}, nullptr, {}, "hcomm:barrier");
}

}  // namespace hcomm
