#include "core/shm/shm_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/shm/pending.h"

namespace hcomm {
namespace {

using clock = std::chrono::steady_clock;
using shm::MessageHeader;
using shm::RegionHeader;
using shm::RingHeader;
using shm::copy_from_ring;
using shm::copy_into_ring;

// Spins before sleeping: a busy peer answers within microseconds, and a
// futex round trip costs more than that; long spins would burn CPU quota.
constexpr int kSpins = 2000;
// Mid-message (the sender is streaming a message larger than the ring, or
// the ring is full) both sides spin this long instead, so a stream does not
// pay a futex sleep and wake-up every time the ring fills.
constexpr auto kStreamSpin = std::chrono::milliseconds(2);
// Longest single sleep, so stop flags and deadlines are seen promptly.
constexpr auto kMaxSleep = std::chrono::milliseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string sys_error(const std::string& what) { return "hcomm shm: " + what + ": " + std::strerror(errno); }

}  // namespace

ShmTransport::ShmTransport(std::string name, int rank, int size, std::chrono::milliseconds timeout, size_t ring_bytes)
    : name_(std::move(name)), rank_(rank), size_(size), timeout_ms_(timeout.count()), ring_bytes_(ring_bytes) {
  HCOMM_CHECK_ARG(size >= 1 && rank >= 0 && rank < size,
                  "hcomm shm: rank " + std::to_string(rank) + " is outside a group of " + std::to_string(size));
  HCOMM_CHECK_ARG(ring_bytes >= 4096 && ring_bytes % 64 == 0,
                  "hcomm shm: ring size must be a multiple of 64 bytes and at least 4096, got " +
                      std::to_string(ring_bytes));
  HCOMM_CHECK_ARG(!name_.empty() && name_.find('/') == std::string::npos,
                  "hcomm shm: group name must be non-empty and contain no '/': '" + name_ + "'");
  regions_.resize(size);
  for (int r = 0; r < size; ++r) out_.push_back(std::make_unique<Outgoing>());
  regions_[rank] = map_region(rank, true);
}

ShmTransport::~ShmTransport() {
  stop_ = true;
  if (regions_[rank_].addr != nullptr) {
    auto* hdr = static_cast<RegionHeader*>(regions_[rank_].addr);
    hdr->doorbell.fetch_add(1);
    shm::futex_wake_all(&hdr->doorbell);
  }
  send_cv_.notify_all();
  if (progress_.joinable()) progress_.join();
  if (sender_.joinable()) sender_.join();
  {
    // Anyone still waiting learns why instead of timing out.
    std::lock_guard<std::mutex> l(send_mu_);
    for (auto& job : send_queue_) {
      std::lock_guard<std::mutex> jl(job->mu);
      job->error = std::make_exception_ptr(Error(ErrorKind::kRuntime, "hcomm shm: transport shut down"));
      job->done = true;
      job->cv.notify_all();
    }
  }
  for (auto& m : regions_)
    if (m.addr != nullptr) munmap(m.addr, m.bytes);
  unlink();
}

ShmTransport::Mapping ShmTransport::map_region(int owner, bool create) {
  const std::string path = "/" + name_ + "-" + std::to_string(owner);
  const size_t bytes = shm::region_bytes(size_, ring_bytes_);
  int fd = create ? shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) throw Error(ErrorKind::kRuntime, sys_error((create ? "cannot create /dev/shm" : "cannot open /dev/shm") + path));
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::string err = sys_error("cannot size /dev/shm" + path + " to " + std::to_string(bytes) + " bytes");
    close(fd);
    shm_unlink(path.c_str());
    throw Error(ErrorKind::kRuntime, err);
  }
  struct stat st;
  if (!create && (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes)) {
    close(fd);
    throw Error(ErrorKind::kRuntime, "hcomm shm: /dev/shm" + path + " has the wrong size for a group of " +
                                         std::to_string(size_) + " with " + std::to_string(ring_bytes_) +
                                         "-byte rings: do all ranks use the same HCOMM_SHM_RING?");
  }
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (addr == MAP_FAILED) {
    if (create) shm_unlink(path.c_str());
    throw Error(ErrorKind::kRuntime, sys_error("cannot map /dev/shm" + path));
  }
  auto* hdr = static_cast<RegionHeader*>(addr);
  if (create) {
    // ftruncate zero-fills: every counter and flag starts at 0.
    hdr->ranks = static_cast<uint32_t>(size_);
    hdr->owner = static_cast<uint32_t>(owner);
    hdr->ring_bytes = ring_bytes_;
    std::atomic_thread_fence(std::memory_order_release);
    hdr->magic = shm::kMagic;
  } else if (hdr->magic != shm::kMagic || hdr->ranks != static_cast<uint32_t>(size_) ||
             hdr->owner != static_cast<uint32_t>(owner) || hdr->ring_bytes != ring_bytes_) {
    munmap(addr, bytes);
    throw Error(ErrorKind::kRuntime, "hcomm shm: /dev/shm" + path + " was not made by rank " + std::to_string(owner) +
                                         " of this group (stale name from another run?)");
  }
  return Mapping{addr, bytes};
}

void ShmTransport::connect() {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && regions_[r].addr == nullptr) regions_[r] = map_region(r, false);
  if (!progress_.joinable()) progress_ = std::thread([this] { progress_loop(); });
  if (!sender_.joinable()) sender_ = std::thread([this] { sender_loop(); });
}

void ShmTransport::unlink() {
  if (unlinked_) return;
  unlinked_ = true;
  shm_unlink(("/" + name_ + "-" + std::to_string(rank_)).c_str());
}

void ShmTransport::run(const CollectiveArgs& args) {
  throw Error(ErrorKind::kInvalidArgument, "hcomm shm transport has no native " + args.describe());
}

// ---- receiving --------------------------------------------------------------

void ShmTransport::progress_loop() {
  std::vector<Incoming> in(size_);
  for (int s = 0; s < size_; ++s) in[s].ring = shm::ring_of(regions_[rank_].addr, s, ring_bytes_);
  auto* hdr = static_cast<RegionHeader*>(regions_[rank_].addr);
  int idle = 0;
  std::optional<clock::time_point> stream_since;  // idle while a message is half-received
  while (!stop_) {
    bool any = false;
    for (int s = 0; s < size_; ++s)
      if (s != rank_) any = drain(s, in[s]) || any;
    if (any) {
      idle = 0;
      stream_since.reset();
      continue;
    }
    if (++idle < kSpins) {
      cpu_relax();
      continue;
    }
    bool streaming = false;
    for (int s = 0; s < size_; ++s) streaming = streaming || (s != rank_ && in[s].in_message);
    if (streaming) {
      if (!stream_since) stream_since = clock::now();
      if (clock::now() - *stream_since < kStreamSpin) {
        idle = 0;
        continue;
      }
    }
    stream_since.reset();
    hdr->receiver_sleeping.store(1);
    const uint32_t seq = hdr->doorbell.load();
    bool waiting = false;
    for (int s = 0; s < size_; ++s)
      if (s != rank_ && in[s].ring->head.load() != in[s].ring->tail.load(std::memory_order_relaxed)) waiting = true;
    if (!waiting && !stop_) shm::futex_wait(&hdr->doorbell, seq, kMaxSleep);
    hdr->receiver_sleeping.store(0);
    idle = 0;
  }
}

void ShmTransport::deliver_header(int source, Incoming& in) {
  in.in_message = true;
  in.remaining = in.hdr.bytes;
  in.offset = 0;
  in.hdr_got = 0;
  const int tag = static_cast<int>(in.hdr.tag);
  std::lock_guard<std::mutex> l(match_mu_);
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (((*it)->peer != source && (*it)->peer != -1) || (*it)->tag != tag) continue;
    std::shared_ptr<RecvSlot> slot = *it;
    posted_.erase(it);
    std::lock_guard<std::mutex> sl(slot->mu);
    slot->source = source;
    if (slot->bytes != in.hdr.bytes) {
      slot->error = "hcomm shm: rank " + std::to_string(rank_) + " expected " + std::to_string(slot->bytes) +
                    " bytes from rank " + std::to_string(source) + " (tag " + std::to_string(tag) + ") but got " +
                    std::to_string(in.hdr.bytes);
      slot->done = true;
      slot->cv.notify_all();
      return;  // the payload is discarded
    }
    slot->matched = true;
    in.slot = std::move(slot);
    return;
  }
  in.stash = std::make_shared<Stashed>();
  in.stash->source = source;
  in.stash->tag = tag;
  in.stash->bytes = in.hdr.bytes;
  in.stash->data.reset(new uint8_t[std::max<uint64_t>(in.hdr.bytes, 1)]);
  stashed_.push_back(in.stash);
}

bool ShmTransport::drain(int source, Incoming& in) {
  RingHeader* ring = in.ring;
  const uint64_t head = ring->head.load(std::memory_order_acquire);
  uint64_t pos = ring->tail.load(std::memory_order_relaxed);
  if (head == pos) return false;
  // Frees space after every step so a waiting sender refills while we copy.
  auto consumed = [&](uint64_t to) {
    ring->tail.store(to);
    if (ring->sender_waiting.load()) {
      ring->space_seq.fetch_add(1);
      shm::futex_wake_all(&ring->space_seq);
    }
  };
  const uint64_t step = std::max<uint64_t>(ring_bytes_ / 4, 4096);
  while (pos < head) {
    const uint64_t avail = head - pos;
    if (!in.in_message) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(sizeof(MessageHeader) - in.hdr_got, avail));
      copy_from_ring(ring, ring_bytes_, pos, reinterpret_cast<char*>(&in.hdr) + in.hdr_got, k);
      in.hdr_got += k;
      pos += k;
      if (in.hdr_got == sizeof(MessageHeader)) deliver_header(source, in);
    } else {
      const size_t k = static_cast<size_t>(std::min(std::min(in.remaining, avail), step));
      if (in.slot) {
        std::lock_guard<std::mutex> sl(in.slot->mu);
        if (!in.slot->cancelled)
          copy_from_ring(ring, ring_bytes_, pos, static_cast<char*>(in.slot->data) + in.offset, k);
      } else if (in.stash) {
        copy_from_ring(ring, ring_bytes_, pos, in.stash->data.get() + in.offset, k);
      }
      in.offset += k;
      in.remaining -= k;
      pos += k;
      consumed(pos);
    }
    if (in.in_message && in.remaining == 0) {
      if (in.slot) {
        std::lock_guard<std::mutex> sl(in.slot->mu);
        in.slot->done = true;
        in.slot->cv.notify_all();
      } else if (in.stash) {
        std::lock_guard<std::mutex> sl(in.stash->mu);
        in.stash->complete = true;
        in.stash->cv.notify_all();
      }
      in.slot.reset();
      in.stash.reset();
      in.in_message = false;
    }
  }
  consumed(pos);
  return true;
}

std::unique_ptr<Pending> ShmTransport::irecv(const Buffer& buf, int peer, int tag) {
  HCOMM_CHECK_ARG(peer == -1 || (peer >= 0 && peer < size_ && peer != rank_),
                  "hcomm shm: rank " + std::to_string(rank_) + " cannot receive from rank " + std::to_string(peer) +
                      " in a group of " + std::to_string(size_));
  std::lock_guard<std::mutex> l(match_mu_);
  for (auto it = stashed_.begin(); it != stashed_.end(); ++it) {
    if ((peer != -1 && (*it)->source != peer) || (*it)->tag != tag) continue;
    auto p = std::make_unique<StashPending>();
    p->msg = *it;
    p->buf = buf;
    p->timeout = timeout();
    p->rank = rank_;
    stashed_.erase(it);
    return p;
  }
  auto slot = std::make_shared<RecvSlot>();
  slot->peer = peer;
  slot->tag = tag;
  slot->data = buf.data;
  slot->bytes = buf.bytes();
  posted_.push_back(slot);
  return std::make_unique<SlotPending>(std::move(slot), &match_mu_, &posted_, timeout(), rank_);
}

// ---- sending ----------------------------------------------------------------

void ShmTransport::ring_doorbell(int peer) {
  auto* hdr = static_cast<RegionHeader*>(regions_[peer].addr);
  if (hdr->receiver_sleeping.load()) {
    hdr->doorbell.fetch_add(1);
    shm::futex_wake_all(&hdr->doorbell);
  }
}

void ShmTransport::write_bytes(int peer, RingHeader* ring, const char* src, size_t n) {
  const uint64_t step = std::max<uint64_t>(ring_bytes_ / 4, 4096);
  auto last_progress = clock::now();
  int spins = 0;
  while (n > 0) {
    const uint64_t head = ring->head.load(std::memory_order_relaxed);
    const uint64_t free = ring_bytes_ - (head - ring->tail.load(std::memory_order_acquire));
    if (free == 0) {
      if (stop_) throw Error(ErrorKind::kRuntime, "hcomm shm: transport shut down while sending");
      if (++spins < kSpins || clock::now() - last_progress < kStreamSpin) {
        cpu_relax();
        continue;
      }
      spins = 0;
      const auto now = clock::now();
      if (now - last_progress > timeout())
        throw Error(ErrorKind::kTimeout, "hcomm shm: rank " + std::to_string(rank_) + " timed out after " +
                                             std::to_string(timeout().count()) + " ms sending to rank " +
                                             std::to_string(peer) + ": it stopped draining (dead or stuck?)");
      ring->sender_waiting.store(1);
      const uint32_t seq = ring->space_seq.load();
      if (ring_bytes_ - (head - ring->tail.load()) == 0) shm::futex_wait(&ring->space_seq, seq, kMaxSleep);
      ring->sender_waiting.store(0);
      continue;
    }
    const size_t k = static_cast<size_t>(std::min<uint64_t>(std::min<uint64_t>(free, n), step));
    copy_into_ring(ring, ring_bytes_, head, src, k);
    ring->head.store(head + k);
    ring_doorbell(peer);
    src += k;
    n -= k;
    last_progress = clock::now();
    spins = 0;
  }
}

void ShmTransport::write_message(int peer, int tag, const void* data, size_t bytes) {
  Outgoing& o = *out_[peer];
  if (!o.broken.empty()) throw Error(ErrorKind::kRuntime, o.broken);
  RingHeader* ring = shm::ring_of(regions_[peer].addr, rank_, ring_bytes_);
  const MessageHeader hdr{tag, bytes};
  try {
    write_bytes(peer, ring, reinterpret_cast<const char*>(&hdr), sizeof(hdr));
    write_bytes(peer, ring, static_cast<const char*>(data), bytes);
  } catch (const std::exception& e) {
    o.broken = std::string("hcomm shm: the stream to rank ") + std::to_string(peer) +
               " broke in an earlier send: " + e.what();
    throw;
  }
}

std::unique_ptr<Pending> ShmTransport::isend(const Buffer& buf, int peer, int tag) {
  HCOMM_CHECK_ARG(peer >= 0 && peer < size_ && peer != rank_,
                  "hcomm shm: rank " + std::to_string(rank_) + " cannot send to rank " + std::to_string(peer) +
                      " in a group of " + std::to_string(size_));
  HCOMM_CHECK_ARG(progress_.joinable(), "hcomm shm: isend before connect()");
  const size_t bytes = buf.bytes();
  {
    // Fits in the ring now and nothing of ours is queued ahead of it: write
    // it here, which is cheaper than a hand-off and cannot block.
    std::unique_lock<std::mutex> sl(send_mu_);
    Outgoing& o = *out_[peer];
    if (o.queued == 0) {
      std::unique_lock<std::mutex> ol(o.mu, std::try_to_lock);
      if (ol.owns_lock()) {
        sl.unlock();
        RingHeader* ring = shm::ring_of(regions_[peer].addr, rank_, ring_bytes_);
        const uint64_t used = ring->head.load(std::memory_order_relaxed) - ring->tail.load(std::memory_order_acquire);
        if (ring_bytes_ - used >= bytes + sizeof(MessageHeader)) {
          write_message(peer, tag, buf.data, bytes);
          return std::make_unique<DonePending>();
        }
        ol.unlock();
        sl.lock();
      }
    }
    auto job = std::make_shared<SendJob>();
    job->peer = peer;
    job->tag = tag;
    job->data = buf.data;
    job->bytes = bytes;
    ++o.queued;
    send_queue_.push_back(job);
    sl.unlock();
    send_cv_.notify_one();
    auto p = std::make_unique<JobPending>();
    p->job = std::move(job);
    p->timeout = timeout();
    return p;
  }
}

void ShmTransport::sender_loop() {
  for (;;) {
    std::shared_ptr<SendJob> job;
    {
      std::unique_lock<std::mutex> l(send_mu_);
      send_cv_.wait(l, [&] { return stop_ || !send_queue_.empty(); });
      if (stop_) return;
      job = send_queue_.front();
      send_queue_.pop_front();
    }
    std::exception_ptr err;
    if (job->cancel) {
      err = std::make_exception_ptr(Error(ErrorKind::kRuntime, "hcomm shm: send cancelled"));
    } else {
      try {
        std::lock_guard<std::mutex> ol(out_[job->peer]->mu);
        write_message(job->peer, job->tag, job->data, job->bytes);
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> l(send_mu_);
      --out_[job->peer]->queued;
    }
    std::lock_guard<std::mutex> jl(job->mu);
    job->error = err;
    job->done = true;
    job->cv.notify_all();
  }
}

}  // namespace hcomm