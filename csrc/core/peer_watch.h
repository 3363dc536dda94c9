// Which peers a rank is blocked on right now (a receive not yet arrived, a
// send not yet taken), so that a timeout can say who had not answered: a bare
// "timed out waiting for ALLREDUCE" on rank 5 of 48 names no one to look at.
#pragma once

#include <map>
#include <mutex>
#include <string>

namespace hcomm {

class PeerWatch {
 public:
  // Brackets one blocking wait on `peer` (-1: any source).
  void enter(int peer, bool recv) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(recv ? recvs_ : sends_)[peer];
  }
  void leave(int peer, bool recv) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& m = recv ? recvs_ : sends_;
    auto it = m.find(peer);
    if (it != m.end() && --it->second == 0) m.erase(it);
  }
  // "a message from rank 3; rank 1 to take a message" style text, "" when
  // nothing is pending.
  std::string describe() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    if (!recvs_.empty()) out = "a message from " + ranks(recvs_);
    if (!sends_.empty()) out += (out.empty() ? "" : " and for ") + ranks(sends_) + " to take a message";
    return out;
  }

 private:
  static std::string ranks(const std::map<int, int>& m) {
    std::string s = m.size() == 1 ? "rank " : "ranks ";
    bool first = true;
    for (const auto& kv : m) {
      s += (first ? "" : ", ") + (kv.first < 0 ? std::string("any rank") : std::to_string(kv.first));
      first = false;
    }
    return s;
  }
  mutable std::mutex mu_;
  std::map<int, int> recvs_, sends_;  // peer -> waits in progress
};

}  // namespace hcomm
