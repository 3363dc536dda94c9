// ProcessGroupHComm: hcomm as a torch.distributed backend.
//
// Every c10d method turns its tensors into one core CollectiveArgs (making
// inputs contiguous and copying results back when needed), submits it to
// the group's Communicator and returns an HCommWork.  The tensors are kept
// alive by the op's hooks until it completes, so async_op=True never blocks
// the caller.  CUDA tensors go to the device backend (torch's NCCL) as they
// are, so stream semantics stay NCCL's.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "core/communicator.h"
#include "torch/work.h"

namespace hcomm {

class C10dTransport;

class ProcessGroupHComm final : public c10d::Backend {
 public:
  ProcessGroupHComm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> host_backend,
                    c10::intrusive_ptr<c10d::Backend> device_backend, CommConfig config);
  ~ProcessGroupHComm() override;

  const std::string getBackendName() const override { return "hcomm"; }
  bool supportsCoalescing() const override { return true; }
  // torch's _set_pg_timeout (torchtitan shortens the timeout after the first
  // step): applies to this group's gloo groups and to ops issued from now on.
  void setTimeout(std::chrono::milliseconds timeout) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // hcomm's own uneven collectives (the direct API): counts in elements.
  c10::intrusive_ptr<c10d::Work> all_gather_v(at::Tensor& output, at::Tensor& input, std::vector<int64_t> counts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_v(at::Tensor& output, at::Tensor& input, std::vector<int64_t> counts,
                                                  const c10d::ReduceOp& op);

  Communicator& communicator() { return *comm_; }
  // Islands found by the Python topology exchange, with this rank's island
  // group (a torch backend over its own PrefixStore) and the tier models.
  void set_hierarchy(std::vector<std::vector<int>> islands, c10::intrusive_ptr<c10d::Backend> island_backend,
                     LinkModel intra, LinkModel inter, std::vector<double> weights, bool proportional,
                     std::vector<int> uplink_sharing,
                     std::shared_ptr<Transport> intra_transport = nullptr,
                     std::vector<double> island_betas = {},
                     Hierarchy::Exchange exchange = Hierarchy::Exchange::kAuto);
  // Weak-tier compression of the hierarchical all-reduce; wire == nullopt: off.
  void set_compression(std::optional<DType> wire, int64_t chunk, bool error_feedback);
  // Host staging of the cross-island tier: `force` pushes CPU tensors through
  // the bridge (HCOMM_FORCE_STAGING; the emulated copy engine), else device
  // tensors get their device's engine.  `chunk_bytes` must agree on all ranks.
  void set_staging(bool force, int64_t chunk_bytes, double copy_alpha, double copy_beta);
  std::string topology_json;  // the Python Topology, for hcomm.topology(group)
  const c10::intrusive_ptr<c10d::Backend>& host_backend() const { return host_backend_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  // Submits `args`; `keep` holds tensors alive, `after` runs on the worker
  // once the op is done (copy-backs), `outputs` is the future's value.
  c10::intrusive_ptr<c10d::Work> run(CollectiveArgs args, c10d::OpType type, std::vector<at::Tensor> keep,
                                     std::function<void()> after, std::vector<at::Tensor> outputs,
                                     const char* title);
  c10::intrusive_ptr<c10d::Work> join(std::vector<c10::intrusive_ptr<c10d::Work>> works, c10d::OpType type,
                                      std::vector<at::Tensor> outputs);
  // Whether the call's tensors are device memory (the device backend runs
  // it).  All must be on one device; a mix, or a device this group has no
  // backend for, is refused naming the op and the rank.
  bool on_device(const char* op, const std::vector<at::Tensor>& tensors) const;

  c10::intrusive_ptr<c10d::Backend> host_backend_;
  c10::intrusive_ptr<c10d::Backend> device_backend_;
  std::shared_ptr<C10dTransport> transport_;  // the flat transport inside comm_
  std::unique_ptr<Communicator> comm_;
  std::chrono::milliseconds timeout_;
  bool coalescing_ = false;
  std::vector<std::shared_ptr<Request>> coalesced_;
  c10::intrusive_ptr<c10d::Backend> island_backend_;
};

// Shared by the method files: argument checks that raise ValueError.
void check_single(const std::vector<at::Tensor>& tensors, const char* op);
void check_dense(const at::Tensor& t, const char* op, const char* what);
void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op);

}  // namespace hcomm
