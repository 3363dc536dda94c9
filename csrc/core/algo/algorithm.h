// The algorithm interface and the context algorithms run in.
//
// Each algorithm lives in its own file and is listed in table.cpp.  An
// algorithm that cannot handle a case returns false from supports() (with a
// reason) and selection moves to the next; cost() is the alpha-beta
// prediction the selector minimises and the benchmarks check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/request.h"
#include "core/transport.h"

namespace hcomm {

// Latency (seconds) and bandwidth (bytes/second) of one link class.
struct LinkModel {
  double alpha = 50e-6;
  double beta = 1.0e9;
  // Time to send `bytes` in `messages` messages.
  double time(double bytes, double messages = 1) const { return messages * alpha + bytes / beta; }
};

// What an algorithm may use.  The hierarchical issue adds island and rail
// transports here; flat algorithms only need `flat`.
struct AlgoContext {
  Transport* flat = nullptr;
  LinkModel flat_link;
  // Local reduction throughput (bytes/second) for the algorithms that reduce
  // received data themselves.
  double reduce_bandwidth = 4.0e9;
  // Scratch memory reused across ops on the worker thread.
  std::vector<uint8_t>* scratch = nullptr;

  int rank() const { return flat->rank(); }
  int size() const { return flat->size(); }
  void* scratch_bytes(size_t n) {
    if (scratch->size() < n) scratch->resize(n);
    return scratch->data();
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
