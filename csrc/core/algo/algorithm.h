// The algorithm interface and the context algorithms run in.
//
// Each algorithm lives in its own file and is listed in table.cpp.  An
// algorithm that cannot handle a case returns false from supports() (with a
// reason) and selection moves to the next; cost() is the alpha-beta
// prediction the selector minimises and the benchmarks check.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/compress/residual_store.h"
#include "core/op.h"
#include "core/request.h"
#include "core/transport.h"

namespace hcomm {

namespace stage {
class CopyEngine;
}

// Latency (seconds) and bandwidth (bytes/second) of one link class.
struct LinkModel {
  double alpha = 50e-6;
  double beta = 1.0e9;
  // Time to send `bytes` in `messages` messages.
  double time(double bytes, double messages = 1) const { return messages * alpha + bytes / beta; }
};

// The cluster as the hierarchical algorithms see it: islands (sets of ranks
// on one fast fabric) of any sizes, this rank's island transport, and the
// link model of each tier.  Absent (nullptr in AlgoContext) for one island.
struct Hierarchy {
  std::vector<std::vector<int>> islands;  // global ranks of each island, ascending
  std::vector<int> island_of;             // global rank -> island index
  std::vector<int> local_index;           // global rank -> index inside its island
  std::shared_ptr<Transport> intra;       // this rank's island group (ranks = local indices)
  LinkModel intra_link, inter_link;
  // Relative inter-island bandwidth of each global rank; when `proportional`,
  // a rank's shard of the cross-island exchange follows it (else equal shards).
  std::vector<double> inter_weight;
  bool proportional = false;
  // Each island's uplink bandwidth (bytes/s, measured by the link probe);
  // empty: inter_link.beta for every island.  The owner exchange sizes the
  // islands' shares of the cross-island reducing by it.
  std::vector<double> island_beta;
  // The cross-island step of the hierarchical all-reduce: the cost model's
  // choice, or forced (HCOMM_HIER_EXCHANGE) for comparisons.
  enum class Exchange : int { kAuto = 0, kDirect = 1, kOwner = 2 };
  Exchange exchange = Exchange::kAuto;
  // How many of an island's ranks share one uplink (ranks on one host share
  // its NIC): the cost model divides the inter bandwidth by it.
  std::vector<int> uplink_sharing;  // per island
  // Weak-tier compression (HCOMM_COMPRESS), used by the cross-island step of
  // the hierarchical all-reduce for fp32/bf16/fp16 sums and averages.
  bool compress = false;
  compress::WireFormat wire;
  bool error_feedback = false;
  std::shared_ptr<compress::ResidualStore> residuals;
  // Host staging of the cross-island tier (stage/): the copy engine for this
  // rank's buffers when they are device memory or the staging mode is on
  // (HCOMM_FORCE_STAGING); nullptr: host memory goes to the network direct.
  std::shared_ptr<stage::CopyEngine> staging;
  // The chunk every rank cuts bridged cross-island messages into (the same
  // on all ranks; 0 when no rank of the group stages: messages go whole).
  size_t bridge_chunk_bytes = 0;
  // Device<->host copies (pinned PCIe; memcpy under the staging mode).
  LinkModel stage_link{10e-6, 10e9};

  int my_island(int rank) const { return island_of[rank]; }
  size_t count() const { return islands.size(); }
};

// What an algorithm may use: the flat group, and the hierarchy when the
// group spans more than one island.
struct AlgoContext {
  Transport* flat = nullptr;
  const Hierarchy* hierarchy = nullptr;
  LinkModel flat_link;
  // Local reduction throughput (bytes/second) for the algorithms that reduce
  // received data themselves.
  double reduce_bandwidth = 4.0e9;
  // Scratch memory reused across ops on the worker thread.
  std::vector<uint8_t>* scratch = nullptr;
  // Reused too: the copy of an input a reduction must leave untouched, and the scratch of the two stage
  // threads a pipelined algorithm runs beside the worker.  A buffer made per op costs more than its
  // copy: the C library hands large ones out as fresh pages, which the kernel clears on first touch
  // (perf on the emulator's TP ranks: clear_page 21-28 % of their CPU, in these buffers' memsets).
  std::vector<uint8_t>* copy = nullptr;
  std::vector<uint8_t>* stage_scratch[2] = {nullptr, nullptr};

  int rank() const { return flat->rank(); }
  int size() const { return flat->size(); }
  void* scratch_bytes(size_t n) { return grown(scratch, n); }
  // `n` bytes of `copy` (a vector of the caller's where the context has none).
  uint8_t* copy_bytes(size_t n, std::vector<uint8_t>& fallback) { return grown(copy ? copy : &fallback, n); }

  static uint8_t* grown(std::vector<uint8_t>* v, size_t n) {
    if (v->size() < n) v->resize(n);
    return v->data();
  }
};

// Reserved tag for algorithm-internal point-to-point traffic, apart from user tags.
constexpr int kAlgoTag = 0x40000;

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual const char* name() const = 0;
  virtual const char* description() const = 0;
  // Whether this algorithm can run `args` here; `why` gets the reason if not.
  virtual bool supports(const CollectiveArgs& args, const AlgoContext& ctx, std::string* why) const = 0;
  // Predicted seconds for `args` (alpha-beta model).
  virtual double cost(const CollectiveArgs& args, const AlgoContext& ctx) const = 0;
  // Runs to completion on the worker thread; may fill record.tiers/chunk_bytes.
  virtual void run(const CollectiveArgs& args, AlgoContext& ctx, OpRecord& record) const = 0;
};

// The table, in preference order (ties in cost go to the earlier entry).
const std::vector<const Algorithm*>& algorithm_table();
const Algorithm* find_algorithm(const std::string& name);

struct Selection {
  const Algorithm* algorithm = nullptr;
  double predicted_seconds = 0;
  std::string note;  // e.g. why a forced algorithm was not used
};
// Picks the cheapest supporting algorithm; `forced` (HCOMM_ALGO) wins when it
// supports the call.  Throws an invalid-argument Error when none supports it.
Selection select_algorithm(const CollectiveArgs& args, const AlgoContext& ctx, const std::string& forced);

}  // namespace hcomm
