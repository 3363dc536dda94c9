// Runs one communicator's operations in issue order on a worker thread,
// never touching the GIL, and completes their requests.
//
// Issue order matters: every rank must run the same collectives in the same
// order on the same transports, and a single FIFO per group guarantees it.
// Point-to-point ops only *post* on the worker (their body returns the
// Pending), so a rank can post a send and then a receive without the send's
// wait blocking the receive's post (batch_isend_irecv relies on this).
//
// Posted ops are then waited for off the worker, one waiter thread per
// *channel* (direction, peer, tag), not per op.  The libraries match
// messages of one channel in posting order (gloo per pair and slot), so its
// ops complete in that order and one thread waiting them FIFO holds nothing
// back; ops of different channels wait on different threads, so a message
// that has arrived completes even while a receive from another peer is
// outstanding (a single FIFO waiter would hold it back and deadlock
// schedules that wait for the later one first).  gloo's send/recv Work can
// only be observed by a blocking wait (no future, is_completed stays false
// until waited), so some thread must block per channel; a pipeline with a
// thousand outstanding messages to two neighbours uses a handful of threads,
// where one thread per op used a thousand.  A channel's thread lingers a
// little after its queue empties, so a stream of messages does not pay a
// thread start each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/request.h"
#include "core/transport.h"

namespace hcomm {

class Executor {
 public:
  // A task runs on the worker; it may fill `record` and may return a Pending
  // to be waited for off the worker (nullptr when it finished its work).
  using Task = std::function<std::unique_ptr<Pending>(OpRecord& record)>;

  Executor();
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // `channel`: for a task that returns a Pending, the key of the channel its
  // completion is ordered in (see above); ops of one channel complete FIFO.
  std::shared_ptr<Request> submit(Task task, OpRecord record, uint64_t channel = 0);
  // Issue order without the worker: when nothing is queued or running here,
  // calls `start` (under the queue lock, so no worker op can slip in before
  // it) with a completion callback and returns the request; otherwise
  // returns nullptr and the caller submits normally.  `start` returns false
  // to decline.
  using DirectStart = std::function<bool(std::function<void(std::exception_ptr)>)>;
  std::shared_ptr<Request> try_direct(const DirectStart& start, OpRecord record);
  // Stops accepting work, fails what is queued, joins the threads.
  void shutdown();
  bool idle() const;
  // Called with each op's record just before its request completes.
  void set_recorder(std::function<void(const OpRecord&)> recorder) { recorder_ = std::move(recorder); }

 private:
  struct Item {
    Task task;
    OpRecord record;
    std::shared_ptr<Request> request;
    std::chrono::steady_clock::time_point start;
    std::unique_ptr<Pending> pending;
    uint64_t channel = 0;
  };
  struct Channel {
    std::deque<Item> queue;
    bool has_waiter = false;
  };
  void work_loop();
  void finish(Item& item, std::exception_ptr error);
  void post(Item item);             // hands a posted op to its channel's waiter
  void drain(uint64_t channel);     // body of a channel's waiter thread

  mutable std::mutex mu_;
  std::condition_variable work_cv_, wait_cv_;
  std::deque<Item> queue_;
  size_t in_flight_ = 0;
  size_t waiters_ = 0;  // live waiter threads; shutdown() waits for none
  std::map<uint64_t, Channel> channels_;
  std::condition_variable channel_cv_;  // a waiter lingering for more work
  // Direct (try_direct) ops still running in the library.  Their completion
  // may run inside start() under mu_, hence a lock of their own.  shutdown()
  // waits for them: their callbacks call the recorder, which points into the
  // Communicator that owns this executor.
  std::mutex direct_mu_;
  std::condition_variable direct_cv_;
  size_t direct_in_flight_ = 0;
  bool stop_ = false;
  std::function<void(const OpRecord&)> recorder_;
  std::thread worker_;
};

}  // namespace hcomm
