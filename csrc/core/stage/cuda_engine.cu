// The CUDA copy engine: pinned host blocks (cudaHostAlloc), one non-blocking
// stream per direction, and an event per copy, so a ticket's wait is the
// event's and the host never waits on a whole stream.  Registered for
// DeviceKind::kCUDA when this file is linked (CUDA builds only).
#include <cuda_runtime.h>

#include <deque>
#include <mutex>

#include "core/error.h"
#include "core/stage/copy_engine.h"

namespace hcomm {
namespace stage {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(ErrorKind::kRuntime, std::string("hcomm staging: ") + what + ": " + cudaGetErrorString(err));
}

// One direction: a stream and the events of its copies still in flight.
class CudaLane {
 public:
  CudaLane() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~CudaLane() {
    for (auto& e : events_) cudaEventDestroy(e.second);
    cudaStreamDestroy(stream_);
  }
  uint64_t post(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, kind, stream_), "cudaMemcpyAsync");
    cudaEvent_t ev;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(ev, stream_), "cudaEventRecord");
    events_.emplace_back(++posted_, ev);
    return posted_;
  }
  void wait(uint64_t seq) {
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& e : events_)
        if (e.first == seq) ev = e.second;
    }
    if (ev) check(cudaEventSynchronize(ev), "cudaEventSynchronize");
    // Events of copies up to seq are complete (one stream, in order): free them.
    std::lock_guard<std::mutex> lock(mu_);
    while (!events_.empty() && events_.front().first <= seq) {
      cudaEventDestroy(events_.front().second);
      events_.pop_front();
    }
  }
  void after(cudaStream_t caller) {
    cudaEvent_t ev;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(ev, caller), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, ev, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ev);  // destruction is deferred by CUDA until the wait is satisfied
  }

 private:
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  std::deque<std::pair<uint64_t, cudaEvent_t>> events_;
  uint64_t posted_ = 0;
};

class CudaEngine final : public CopyEngine {
 public:
  ~CudaEngine() override { release_pool(); }
  const char* name() const override { return "cuda"; }
  DeviceKind device() const override { return DeviceKind::kCUDA; }
  void after_stream(void* stream) override {
    // nullptr is the legacy default stream, torch's default stream (our
    // non-blocking streams do not sync with it implicitly, hence the event).
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    up_.after(s);
    down_.after(s);
  }
  Ticket to_host(void* host, const void* device, size_t bytes) override {
    count_bytes(bytes);
    return Ticket{Direction::kToHost, up_.post(host, device, bytes, cudaMemcpyDeviceToHost)};
  }
  Ticket to_device(void* device, const void* host, size_t bytes) override {
    count_bytes(bytes);
    return Ticket{Direction::kToDevice, down_.post(device, host, bytes, cudaMemcpyHostToDevice)};
  }
  void wait(const Ticket& t) override {
    if (t.seq) (t.direction == Direction::kToHost ? up_ : down_).wait(t.seq);
  }

 protected:
  void* allocate_host(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void free_host(void* p) override { cudaFreeHost(p); }

 private:
  CudaLane up_, down_;
};

std::shared_ptr<CopyEngine> make_cuda_engine() { return std::make_shared<CudaEngine>(); }
const bool registered = register_engine(DeviceKind::kCUDA, &make_cuda_engine);

}  // namespace
}  // namespace stage
}  // namespace hcomm
