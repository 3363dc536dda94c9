#include "core/stage/bridge.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace hcomm {
namespace stage {

struct Bridge::Message {
  Buffer buf;  // the caller's range
  int peer = -1;
  bool staged = false;
  std::shared_ptr<HostBlock> block;  // staged: the host copy (shared by sends of one range)
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (byte offset, bytes)
  std::vector<Ticket> copies;                      // per chunk (staged)
  std::vector<std::unique_ptr<Pending>> wire;      // per chunk

  Buffer piece(size_t k, bool host) const {
    Buffer b = buf;
    const size_t esize = dtype_size(buf.dtype);
    b.data = (host ? block->data() : static_cast<char*>(buf.data)) + chunks[k].first;
    b.count = chunks[k].second / static_cast<int64_t>(esize);
    if (host) b.device = DeviceKind::kCPU;
    return b;
  }
};

Bridge::Bridge(Transport& flat, CopyEngine* engine, size_t chunk_bytes, int tag)
    : flat_(flat), engine_(engine), chunk_bytes_(chunk_bytes), tag_(tag) {}

Bridge::~Bridge() {
  if (finished_) return;
  // Unfinished (an exception left the algorithm early): the transport and
  // the engine may still write into the host blocks, so they are never
  // handed back; a failed collective leaks its staging memory, nothing else.
  for (auto* list : {&sends_, &recvs_})
    for (auto& m : *list)
      if (m->block) new std::shared_ptr<HostBlock>(m->block);
}

std::vector<std::pair<int64_t, int64_t>> Bridge::chunks_of(size_t bytes, size_t esize) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  // Boundaries on whole elements; both ends compute the same ones.
  const size_t chunk = chunk_bytes_ ? std::max(esize, chunk_bytes_ / esize * esize) : 0;
  if (chunk == 0 || bytes <= chunk) {
    out.emplace_back(0, static_cast<int64_t>(bytes));
    return out;
  }
  for (size_t at = 0; at < bytes; at += chunk)
    out.emplace_back(static_cast<int64_t>(at), static_cast<int64_t>(std::min(chunk, bytes - at)));
  return out;
}

void Bridge::send(const Buffer& buf, int peer, bool device_memory) {
  auto m = std::make_unique<Message>();
  m->buf = buf;
  m->peer = peer;
  m->staged = engine_ && device_memory;
  m->chunks = chunks_of(buf.bytes(), dtype_size(buf.dtype));
  if (m->staged) {
    for (auto& other : sends_)
      if (other->staged && other->buf.data == buf.data && other->buf.count == buf.count) m->block = other->block;
    if (m->block) {
      m->copies = std::vector<Ticket>(m->chunks.size());  // already on its way up
    } else {
      m->block = std::make_shared<HostBlock>(engine_->host_block(buf.bytes()));
      for (size_t k = 0; k < m->chunks.size(); ++k) {
        const auto [off, len] = m->chunks[k];
        m->copies.push_back(engine_->to_host(m->block->data() + off, static_cast<char*>(buf.data) + off, len));
        staged_bytes_ += static_cast<size_t>(len);
      }
    }
  }
  sends_.push_back(std::move(m));
}

void Bridge::recv(const Buffer& buf, int peer, bool device_memory) {
  auto m = std::make_unique<Message>();
  m->buf = buf;
  m->peer = peer;
  m->staged = engine_ && device_memory;
  m->chunks = chunks_of(buf.bytes(), dtype_size(buf.dtype));
  if (m->staged) m->block = std::make_shared<HostBlock>(engine_->host_block(buf.bytes()));
  // Posted now, so a peer's chunks land while this rank still copies its own up.
  for (size_t k = 0; k < m->chunks.size(); ++k) m->wire.push_back(flat_.irecv(m->piece(k, m->staged), peer, tag_));
  recvs_.push_back(std::move(m));
}

void Bridge::finish() {
  // Each send's chunk goes on the wire as soon as its copy up has landed.
  for (auto& m : sends_)
    for (size_t k = 0; k < m->chunks.size(); ++k) {
      if (m->staged) engine_->wait(m->copies[k]);
      m->wire.push_back(flat_.isend(m->piece(k, m->staged), m->peer, tag_));
    }
  // Each received chunk starts down as soon as it has arrived.
  Ticket last_down;
  for (auto& m : recvs_)
    for (size_t k = 0; k < m->chunks.size(); ++k) {
      m->wire[k]->wait();
      if (!m->staged) continue;
      const auto [off, len] = m->chunks[k];
      last_down = engine_->to_device(static_cast<char*>(m->buf.data) + off, m->block->data() + off, len);
      staged_bytes_ += static_cast<size_t>(len);
    }
  for (auto& m : sends_)
    for (auto& p : m->wire) p->wait();
  // One direction completes in order: the last copy down covers the rest.
  if (engine_) engine_->wait(last_down);
  finished_ = true;
}

}  // namespace stage
}  // namespace hcomm
