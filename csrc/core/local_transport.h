// An in-process transport: ranks are threads of one process exchanging
// messages through a shared hub.  It offers point-to-point only, so every
// collective runs through hcomm's own algorithms: this is how the algorithms
// are tested without processes or sockets (like gloo's BaseTest::spawn).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/transport.h"

namespace hcomm {

class LocalHub {
 public:
  explicit LocalHub(int size) : size_(size) {}
  int size() const { return size_; }
  void post(int src, int dst, int tag, const void* data, size_t bytes);
  // Takes the oldest message from src (or any source when src == -1) to dst
  // with `tag`; returns the source, throws a timeout Error after `timeout`.
  int take(int src, int dst, int tag, void* data, size_t bytes, std::chrono::milliseconds timeout);
  // Makes every waiting and later take() fail: a "dead peer" for tests.
  void kill(const std::string& why);

 private:
  using Key = std::tuple<int, int, int>;  // src, dst, tag
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::vector<std::vector<uint8_t>>> boxes_;
  std::string dead_;
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalHub> hub, int rank, std::chrono::milliseconds timeout)
      : hub_(std::move(hub)), rank_(rank), timeout_(timeout) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  std::string library() const override { return "local"; }
  bool supports(const CollectiveArgs&) const override { return false; }
  void run(const CollectiveArgs& args) override;
  std::unique_ptr<Pending> isend(const Buffer& buf, int peer, int tag) override;
  std::unique_ptr<Pending> irecv(const Buffer& buf, int peer, int tag) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  std::shared_ptr<LocalHub> hub_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

}  // namespace hcomm
