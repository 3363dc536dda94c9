// A small helper pool for the kernels (see threads.h for the policy).
//
// The pool has hardware_concurrency() - 1 workers, started on first use.
// A caller reserves idle workers with a CAS on one counter, wakes them on
// its Grains, takes grains itself until none is left and waits on a latch.
// Reserving rather than queueing means the number of busy kernel threads never exceeds
// the core count however many communicator threads call in at once.
//
// After fork() the child has no workers; an atfork handler drops the pool
// (leaking it: its mutexes may be held by threads that no longer exist) so
// the child builds a fresh one on first use.
#include "core/kernels/threads.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace hcomm {
namespace kernels {
namespace {

struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  int pending;
  std::exception_ptr error;

  explicit Latch(int n) : pending(n) {}
  void done(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e && !error) error = e;
    if (--pending == 0) cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
};

// The work of one call, handed out in grains to whoever is running: the
// caller and the helpers it reserved each take the next grain until none is
// left, so a helper that wakes late (an idle vCPU, a core busy with another
// library's spinning threads) takes fewer grains instead of making the call
// wait for a fixed half of the work.
struct Grains {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n, grain;
  std::atomic<int64_t> next{0};

  void run() {
    for (int64_t b = next.fetch_add(grain, std::memory_order_relaxed); b < n;
         b = next.fetch_add(grain, std::memory_order_relaxed))
      (*fn)(b, std::min(n, b + grain));
  }
};

struct Task {
  Grains* work;
  Latch* latch;
};

class Pool {
 public:
  explicit Pool(int workers) : idle_(workers) {
    for (int i = 0; i < workers; ++i) std::thread([this] { loop(); }).detach();
  }

  // Takes up to `want` idle workers; returns how many it got.
  int reserve(int want) {
    int idle = idle_.load(std::memory_order_relaxed);
    while (idle > 0) {
      int take = std::min(idle, want);
      if (idle_.compare_exchange_weak(idle, idle - take, std::memory_order_acquire)) return take;
    }
    return 0;
  }

  void release(int k) { idle_.fetch_add(k, std::memory_order_release); }

  void submit(const Task& t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(t);
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        t = queue_.front();
        queue_.pop_front();
      }
      std::exception_ptr err;
      try {
        t.work->run();
      } catch (...) {
        err = std::current_exception();
        t.work->next.store(t.work->n);  // the others stop after their current grain
      }
      t.latch->done(err);
    }
  }

  std::atomic<int> idle_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
};

std::atomic<Pool*> g_pool{nullptr};
std::mutex g_pool_mu;

void drop_pool_in_child() { g_pool.store(nullptr); new (&g_pool_mu) std::mutex(); }

Pool* pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return p;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  p = g_pool.load(std::memory_order_relaxed);
  if (p == nullptr) {
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, drop_pool_in_child); });
    int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    p = new Pool(hw - 1);  // intentionally never deleted: workers live as long as the process
    g_pool.store(p, std::memory_order_release);
  }
  return p;
}

}  // namespace

int kernel_threads() {
  const char* env = std::getenv("HCOMM_KERNEL_THREADS");
  if (env != nullptr && std::atoi(env) > 0) return std::atoi(env);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void parallel_for(int64_t n, int64_t align, size_t bytes_per_elem,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  align = std::max<int64_t>(align, 1);
  const size_t bytes = static_cast<size_t>(n) * bytes_per_elem;
  int want = 1;
  if (bytes >= kParallelMinBytes) {
    want = static_cast<int>(std::min<size_t>(static_cast<size_t>(kernel_threads()), bytes / kParallelGrainBytes));
    want = static_cast<int>(std::min<int64_t>(want, (n + align - 1) / align));
  }
  int helpers = want > 1 ? pool()->reserve(want - 1) : 0;
  if (helpers == 0) {
    fn(0, n);
    return;
  }
  const int parts = helpers + 1;
  // Grains of >= kParallelGrainBytes and about 16 per thread: few enough that
  // handing them out costs nothing, enough to even out a late start.
  const int64_t min_grain = static_cast<int64_t>(kParallelGrainBytes / std::max<size_t>(bytes_per_elem, 1));
  int64_t grain = std::max<int64_t>(min_grain, (n + 16 * parts - 1) / (16 * parts));
  grain = (grain + align - 1) / align * align;
  Grains work;
  work.fn = &fn;
  work.n = n;
  work.grain = grain;
  Latch latch(helpers);
  for (int k = 1; k < parts; ++k) pool()->submit(Task{&work, &latch});
  std::exception_ptr mine;
  try {
    work.run();
  } catch (...) {
    mine = std::current_exception();
    work.next.store(n);  // the others stop after their current grain
  }
  latch.wait();
  pool()->release(helpers);
  if (mine) std::rethrow_exception(mine);
  if (latch.error) std::rethrow_exception(latch.error);
}

}  // namespace kernels
}  // namespace hcomm
