// The vendor-library interface: one process group over one library (gloo,
// NCCL, HCCL, or the in-process thread transport used by tests).
//
// A transport offers point-to-point messages (required) and whichever
// collectives its library does natively (optional: `supports`).  hcomm's own
// algorithms are built on point-to-point, so a library without, say,
// all_to_all_v or an int16 reduction still gets every collective.
//
// All calls are made from one communicator's worker thread, in issue order,
// so implementations need not be re-entrant per instance.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "core/op.h"

namespace hcomm {

// An operation in flight; wait() blocks until done and throws on failure.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
  // For recv from any source: the rank that sent it (-1 when unknown).
  virtual int source() const { return -1; }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Library name: "gloo", "nccl", "hccl", "local".
  virtual std::string library() const = 0;

  // Whether `run` can do `args` natively (checked by the "native" algorithm).
  virtual bool supports(const CollectiveArgs& args) const = 0;
  // Runs a native collective to completion (blocking).
  virtual void run(const CollectiveArgs& args) = 0;
  // Starts a native collective and calls `done` (on any thread) when it
  // finishes.  Returns false if this transport cannot start ops
  // asynchronously; then nothing was started.  Lets a lone native op skip
  // the worker thread hand-off, which is most of hcomm's small-message cost.
  virtual bool start(const CollectiveArgs& args, std::function<void(std::exception_ptr)> done) {
    (void)args;
    (void)done;
    return false;
  }

  virtual std::unique_ptr<Pending> isend(const Buffer& buf, int peer, int tag) = 0;
  // peer == -1: from any source (Pending::source() tells which).
  virtual std::unique_ptr<Pending> irecv(const Buffer& buf, int peer, int tag) = 0;

  // The group's timeout, so algorithms and waits agree with the library's.
  virtual std::chrono::milliseconds timeout() const = 0;
  // Changes it (hcomm.set_timeout); transports without one of their own ignore it.
  virtual void set_timeout(std::chrono::milliseconds) {}
};

}  // namespace hcomm
