#include "core/local_transport.h"

#include <cstring>

#include "core/error.h"

namespace hcomm {

void LocalHub::post(int src, int dst, int tag, const void* data, size_t bytes) {
  std::vector<uint8_t> msg(bytes);
  if (bytes) std::memcpy(msg.data(), data, bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!dead_.empty()) throw Error(ErrorKind::kRuntime, dead_);
    boxes_[Key{src, dst, tag}].push_back(std::move(msg));
  }
  cv_.notify_all();
}

int LocalHub::take(int src, int dst, int tag, void* data, size_t bytes, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<uint8_t> msg;
  int from = -1;
  auto ready = [&] {
    if (!dead_.empty()) return true;
    for (int s = (src < 0 ? 0 : src); s < (src < 0 ? size_ : src + 1); ++s) {
      auto it = boxes_.find(Key{s, dst, tag});
      if (it != boxes_.end() && !it->second.empty()) {
        msg = std::move(it->second.front());
        it->second.erase(it->second.begin());
        from = s;
        return true;
      }
    }
    return false;
  };
  if (!cv_.wait_for(lock, timeout, ready))
    throw Error(ErrorKind::kTimeout, "hcomm: rank " + std::to_string(dst) + " timed out after " +
                                         std::to_string(timeout.count()) + " ms waiting for a message from rank " +
                                         (src < 0 ? std::string("any") : std::to_string(src)));
  if (from < 0) throw Error(ErrorKind::kRuntime, dead_);
  if (msg.size() != bytes)
    throw Error(ErrorKind::kRuntime, "hcomm: rank " + std::to_string(dst) + " expected " + std::to_string(bytes) +
                                         " bytes from rank " + std::to_string(from) + " but got " +
                                         std::to_string(msg.size()));
  if (bytes) std::memcpy(data, msg.data(), bytes);
  return from;
}

void LocalHub::kill(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead_ = why;
  }
  cv_.notify_all();
}

void LocalTransport::run(const CollectiveArgs& args) {
  throw Error(ErrorKind::kInvalidArgument, "local transport has no native " + args.describe());
}

namespace {
struct Done final : Pending {
  void wait() override {}
};
struct LocalRecv final : Pending {
  std::shared_ptr<LocalHub> hub;
  Buffer buf;
  int peer, rank, tag, from = -1;
  std::chrono::milliseconds timeout;
  void wait() override { from = hub->take(peer, rank, tag, buf.data, buf.bytes(), timeout); }
  int source() const override { return from; }
};
}  // namespace

std::unique_ptr<Pending> LocalTransport::isend(const Buffer& buf, int peer, int tag) {
  hub_->post(rank_, peer, tag, buf.data, buf.bytes());  // eager: copied now
  return std::make_unique<Done>();
}

std::unique_ptr<Pending> LocalTransport::irecv(const Buffer& buf, int peer, int tag) {
  auto r = std::make_unique<LocalRecv>();
  r->hub = hub_;
  r->buf = buf;
  r->peer = peer;
  r->rank = rank_;
  r->tag = tag;
  r->timeout = timeout_;
  return r;
}

}  // namespace hcomm
