// A point-to-point transport between processes on one host, over POSIX
// shared memory: what an island's ranks use when they share a host, instead
// of TCP over loopback.  Like NCCL's SHM transport it costs two memcpys per
// message (into the ring, out of it) and no syscalls while both sides are
// busy; on the emulator's CPU quotas it moves data several times faster
// than gloo's loopback sockets, whose kernel copies and wake-ups the quota
// also pays for.
//
// Threads: a progress thread drains every incoming ring, straight into a
// posted receive buffer when one matches (source, tag) and into a stash
// otherwise, so a sender never waits on the receiver's program order.  A
// send that fits in the ring's free space is written by the caller; a
// larger one goes to a sender thread, so isend returns at once and the
// caller can post its receive (the ring algorithms rely on that to avoid
// the stash copy).  Messages from one source with one tag match receives
// in order, as with gloo.
//
// Setup: every rank creates its region (create()), the group meets at a
// store barrier, each maps its peers' regions (connect()), meets again, and
// unlinks its own name (unlink()): after that no name is left in /dev/shm
// even if a process is killed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/shm/ring.h"
#include "core/transport.h"

namespace hcomm {

class ShmTransport final : public Transport {
 public:
  // Creates and maps this rank's region `/<name>-<rank>`.
  ShmTransport(std::string name, int rank, int size, std::chrono::milliseconds timeout, size_t ring_bytes);
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  // Maps every peer's region (all must have been created) and starts the threads.
  void connect();
  // Removes this rank's name; mappings stay valid.
  void unlink();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string library() const override { return "shm"; }
  bool supports(const CollectiveArgs&) const override { return false; }
  void run(const CollectiveArgs& args) override;
  std::unique_ptr<Pending> isend(const Buffer& buf, int peer, int tag) override;
  std::unique_ptr<Pending> irecv(const Buffer& buf, int peer, int tag) override;
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(timeout_ms_.load()); }
  void set_timeout(std::chrono::milliseconds t) override { timeout_ms_ = t.count(); }
  size_t ring_bytes() const { return ring_bytes_; }

  struct RecvSlot;
  struct Stashed;
  struct SendJob;

 private:
  struct Mapping {
    void* addr = nullptr;
    size_t bytes = 0;
  };
  struct Incoming;  // per-source parse state, progress thread only
  struct Outgoing {  // per-peer sending state
    std::mutex mu;   // one message at a time per ring
    int queued = 0;  // jobs for this peer not yet written (guarded by send_mu_)
    std::string broken;  // set when a send failed mid-message: the stream is lost
  };

  Mapping map_region(int owner, bool create);
  void progress_loop();
  bool drain(int source, Incoming& in);
  void deliver_header(int source, Incoming& in);
  void sender_loop();
  // Writes one whole message into `peer`'s ring; throws on timeout.
  void write_message(int peer, int tag, const void* data, size_t bytes);
  // Streams n bytes into the ring as space frees; throws when the receiver
  // makes no progress for the timeout.
  void write_bytes(int peer, shm::RingHeader* ring, const char* src, size_t n);
  void ring_doorbell(int peer);

  std::string name_;
  int rank_, size_;
  std::atomic<int64_t> timeout_ms_;  // callers may change it while ops run
  size_t ring_bytes_;
  std::vector<Mapping> regions_;  // [rank_] is ours (incoming), others are peers'
  std::vector<std::unique_ptr<Outgoing>> out_;
  bool unlinked_ = false;

  // Matching state, shared by callers and the progress thread.
  std::mutex match_mu_;
  std::deque<std::shared_ptr<RecvSlot>> posted_;
  std::deque<std::shared_ptr<Stashed>> stashed_;

  // Sender thread.
  std::mutex send_mu_;
  std::condition_variable send_cv_;
  std::deque<std::shared_ptr<SendJob>> send_queue_;

  std::atomic<bool> stop_{false};
  std::thread progress_, sender_;
};

}  // namespace hcomm
