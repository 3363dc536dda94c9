// Runs one communicator's operations in issue order on a worker thread,
// never touching the GIL, and completes their requests.
//
// Issue order matters: every rank must run the same collectives in the same
// order on the same transports, and a single FIFO per group guarantees it.
// Point-to-point ops only *post* on the worker (their body returns the
// Pending); each posted op is then waited for on a short-lived thread of its
// own, so a rank can post a send and then a receive without the send's wait
// blocking the receive's post (batch_isend_irecv relies on this), and a
// message that has arrived completes even while an earlier receive from
// another peer is still outstanding (a single FIFO waiter would hold it back
// and deadlock schedules that wait for the later one first).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
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

  std::shared_ptr<Request> submit(Task task, OpRecord record);
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
  };
  void work_loop();
  void finish(Item& item, std::exception_ptr error);
  void wait_one(Item item);  // body of a posted op's waiter thread

  mutable std::mutex mu_;
  std::condition_variable work_cv_, wait_cv_;
  std::deque<Item> queue_;
  size_t in_flight_ = 0;
  size_t waiters_ = 0;  // live waiter threads; shutdown() waits for none
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
