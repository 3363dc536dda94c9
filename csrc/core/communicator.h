// The unified collective API.  One Communicator per process group: it
// validates on the caller's thread, picks an algorithm from the table, and
// runs the op on its executor in issue order.  Buffers must stay valid until
// the returned Request completes (the torch layer keeps its tensors alive in
// the hooks it passes).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/algo/algorithm.h"
#include "core/executor.h"
#include "core/peer_watch.h"
#include "core/request.h"
#include "core/transport.h"

namespace hcomm {

struct CommConfig {
  std::string forced_algorithm;  // HCOMM_ALGO
  bool debug_checks = false;     // HCOMM_DEBUG: cross-rank signature check before each op
  LinkModel flat_link;
  size_t history_limit = 1024;
};

// Work the caller's layer does around the op on the worker thread, e.g.
// copying a contiguous result back into a strided tensor.  They also own
// (capture) whatever keeps the buffers alive.
struct OpHooks {
  std::function<void()> before;
  std::function<void()> after;
};

class Communicator {
 public:
  Communicator(std::shared_ptr<Transport> flat, CommConfig config);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& library() const { return library_; }

  // The general entry point every named collective below goes through.
  std::shared_ptr<Request> submit(CollectiveArgs args, OpHooks hooks = {});

  std::shared_ptr<Request> all_reduce(Buffer buf, ReduceOp op, OpHooks hooks = {});
  std::shared_ptr<Request> reduce(Buffer buf, ReduceOp op, int root, OpHooks hooks = {});
  std::shared_ptr<Request> broadcast(Buffer buf, int root, OpHooks hooks = {});
  std::shared_ptr<Request> all_gather(Buffer in, Buffer out, OpHooks hooks = {});
  std::shared_ptr<Request> all_gather_v(Buffer in, Buffer out, std::vector<int64_t> counts, OpHooks hooks = {});
  std::shared_ptr<Request> reduce_scatter(Buffer in, Buffer out, ReduceOp op, OpHooks hooks = {});
  std::shared_ptr<Request> reduce_scatter_v(Buffer in, Buffer out, std::vector<int64_t> counts, ReduceOp op,
                                            OpHooks hooks = {});
  std::shared_ptr<Request> all_to_all(Buffer in, Buffer out, OpHooks hooks = {});
  std::shared_ptr<Request> all_to_all_v(Buffer in, Buffer out, std::vector<int64_t> send_counts,
                                        std::vector<int64_t> recv_counts, OpHooks hooks = {});
  std::shared_ptr<Request> gather(Buffer in, Buffer out, int root, OpHooks hooks = {});
  std::shared_ptr<Request> scatter(Buffer in, Buffer out, int root, OpHooks hooks = {});
  std::shared_ptr<Request> send(Buffer buf, int peer, int tag, OpHooks hooks = {});
  std::shared_ptr<Request> recv(Buffer buf, int peer, int tag, OpHooks hooks = {});
  std::shared_ptr<Request> barrier(OpHooks hooks = {});
  // A collective the caller's layer refused before submit (its own argument
  // checks): it keeps this rank's place in the sequence and, under
  // HCOMM_DEBUG, tells the other ranks at once.  submit() calls it itself.
  void reject(const CollectiveArgs& args, const std::string& why);

  // Which algorithm would run `args` (HCOMM_ALGO honoured) and its predicted time.
  Selection plan(const CollectiveArgs& args) const;
  // Predicted seconds of a named algorithm for `args` (NaN when unsupported).
  double predict(const CollectiveArgs& args, const std::string& algorithm) const;

  void set_forced_algorithm(const std::string& name);
  std::string forced_algorithm() const;
  void set_link_model(const LinkModel& link);
  // Installs the cluster's islands (nullptr: one island).  Call before the
  // first op; the hierarchical algorithms become eligible from then on.
  void set_hierarchy(std::shared_ptr<const Hierarchy> hierarchy);
  std::shared_ptr<const Hierarchy> hierarchy() const;

  std::vector<OpRecord> history() const;
  void clear_history();

  void shutdown();

 private:
  void remember(const OpRecord& record);
  // HCOMM_DEBUG (debug_check.cpp); `invalid`: this rank rejected the call.
  void debug_check(const CollectiveArgs& args, uint64_t seq, bool invalid);
  void debug_check_counts(const CollectiveArgs& args);
  void debug_check_splits(const CollectiveArgs& args);
  AlgoContext context() const;  // flat transport, link model, hierarchy

  std::shared_ptr<PeerWatch> watch_;  // before flat_, which reports into it
  std::shared_ptr<Transport> flat_;
  CommConfig config_;
  int rank_, size_;
  std::string library_;
  mutable std::mutex mu_;
  uint64_t next_seq_ = 0;
  // Collectives only: point-to-point counts legitimately differ per rank, so
  // HCOMM_DEBUG compares this number, not OpRecord::seq.
  uint64_t next_collective_seq_ = 0;
  std::deque<OpRecord> history_;
  std::shared_ptr<const Hierarchy> hierarchy_;
  std::vector<uint8_t> scratch_;  // used on the worker only (and the three below: AlgoContext)
  std::vector<uint8_t> copy_;
  std::vector<uint8_t> stage_scratch_[2];
  Executor executor_;            // last: its threads stop before the members above go
};

}  // namespace hcomm
