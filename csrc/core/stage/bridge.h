// The cross-island point-to-point of the hierarchical algorithms.
//
// On host memory a message is the flat transport's isend/irecv.  On device
// memory (or any memory under the staging mode) it crosses as device ->
// host staging block -> network -> host block -> device, in chunks, so
// chunk k's copy overlaps chunk k-1 on the wire and the copy back of chunk
// k overlaps chunk k+1 arriving.  When the group bridges at all
// (chunk_bytes > 0) every rank cuts every message into the same chunks,
// staged or not, because the k-th sub-message on a (peer, tag) pair must
// match the k-th one: a CPU island talks to a GPU island in the GPU's chunks.
#pragma once

#include <memory>
#include <vector>

#include "core/stage/copy_engine.h"
#include "core/transport.h"

namespace hcomm {
namespace stage {

class Bridge {
 public:
  // engine: nullptr sends and receives host memory directly.
  // chunk_bytes: 0 sends each message whole (a group with no staged rank).
  Bridge(Transport& flat, CopyEngine* engine, size_t chunk_bytes, int tag);
  ~Bridge();
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;

  // Posts a message.  `device_memory` says whether `buf` lies in the
  // caller's (device) memory, which only the engine may touch, or in the
  // algorithm's own host scratch.  Sending one device range to several peers
  // stages it once.
  void send(const Buffer& buf, int peer, bool device_memory = true);
  void recv(const Buffer& buf, int peer, bool device_memory = true);
  // Completes everything posted and rethrows the first failure.
  void finish();
  // Bytes this bridge copied between device and host.
  size_t staged_bytes() const { return staged_bytes_; }

 private:
  struct Message;
  std::vector<std::pair<int64_t, int64_t>> chunks_of(size_t bytes, size_t esize) const;
  Transport& flat_;
  CopyEngine* engine_;
  size_t chunk_bytes_;
  int tag_;
  std::vector<std::unique_ptr<Message>> sends_, recvs_;
  size_t staged_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace stage
}  // namespace hcomm
