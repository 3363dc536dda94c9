// The staging mode's engine: "device" memory is CPU memory, and each
// direction is a thread that runs its copies in issue order, the way a copy
// stream does.  Tickets complete when that thread has done the copy, so the
// bridge's callers wait on exactly what they would wait on with a GPU.
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "core/error.h"
#include "core/stage/copy_engine.h"

namespace hcomm {
namespace stage {
namespace {

class CopyLane {
 public:
  CopyLane() : thread_([this] { loop(); }) {}
  ~CopyLane() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  uint64_t post(void* dst, const void* src, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(Job{dst, src, bytes, ++posted_});
    cv_.notify_all();
    return posted_;
  }
  void wait(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_ >= seq; });
  }

 private:
  struct Job {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t seq;
  };
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      Job job = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      if (job.bytes) std::memcpy(job.dst, job.src, job.bytes);
      lock.lock();
      done_ = job.seq;
      done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;
  uint64_t posted_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

class EmulatedEngine final : public CopyEngine {
 public:
  ~EmulatedEngine() override { release_pool(); }
  const char* name() const override { return "emulated"; }
  DeviceKind device() const override { return DeviceKind::kCPU; }
  Ticket to_host(void* host, const void* device, size_t bytes) override {
    count_bytes(bytes);
    return Ticket{Direction::kToHost, lanes_[0].post(host, device, bytes)};
  }
  Ticket to_device(void* device, const void* host, size_t bytes) override {
    count_bytes(bytes);
    return Ticket{Direction::kToDevice, lanes_[1].post(device, host, bytes)};
  }
  void wait(const Ticket& t) override {
    if (t.seq) lanes_[static_cast<int>(t.direction)].wait(t.seq);
  }

 protected:
  void* allocate_host(size_t bytes) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) throw Error(ErrorKind::kRuntime, "hcomm: cannot allocate " + std::to_string(bytes) + " bytes of staging memory");
    return p;
  }
  void free_host(void* p) override { std::free(p); }

 private:
  CopyLane lanes_[2];
};

}  // namespace

std::shared_ptr<CopyEngine> emulated_engine() {
  // Lives to process exit: collectives on detached worker threads may still
  // hold tickets while statics are torn down.
  static auto* engine = new std::shared_ptr<CopyEngine>(std::make_shared<EmulatedEngine>());
  return *engine;
}

}  // namespace stage
}  // namespace hcomm
