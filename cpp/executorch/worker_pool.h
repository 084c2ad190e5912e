// WorkerPool: a fixed set of threads, started once, that run the tasks of one job at a
// time with the calling thread (AttendSession's tiled attention). Exception-free (POSIX
// threads, their errors returned as Status), and a job allocates nothing: it is a
// function pointer, a context pointer and a task count.
//
// Why not ExecuTorch's own pool: the executorch 1.5.1 wheel ships
// libexecutorch_threadpool.so (whose parallel_for its optimized kernels use) but no
// header declaring parallel_for or the pool, only threadpool_guard.h; a kernel would
// have to declare a mangled signature itself (it changed between releases), and the
// session behind the kernel knows nothing of ExecuTorch. The op runs between the
// runtime's other kernels, never beside them, so the two pools take turns.
#pragma once

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>

#include "kvcore/core/result.h"
#include "kvcore/core/status.h"

namespace kvcore {
namespace et {

class WorkerPool {
 public:
  /// One task: `task` in [0, n_tasks) of the job, run by worker `worker` in [0, workers())
  /// (0 is the calling thread); a worker runs one task at a time.
  using TaskFn = void (*)(void* context, int task, int worker);

  /// The most workers a pool may have (the caller and 255 threads).
  static constexpr int kMaxWorkers = 256;

  /// A pool of `workers` workers: the calling thread of run() and `workers - 1` threads
  /// started now (they sleep between jobs). InvalidArgument: `workers` outside [1,
  /// kMaxWorkers]. MemoryAllocationFailed: no memory, or a thread could not be started
  /// (the ones started are stopped; nothing kept).
  static Result<std::unique_ptr<WorkerPool>> create(int workers) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(workers >= 1 && workers <= kMaxWorkers, InvalidArgument,
                                 "threads = %d: must be in [1, %d]", workers, kMaxWorkers);
    std::unique_ptr<WorkerPool> pool(new (std::nothrow) WorkerPool());
    KVCORE_CHECK_OR_RETURN_ERROR(pool != nullptr, MemoryAllocationFailed, "WorkerPool: out of memory");
    pool->threads_.reset(new (std::nothrow) Thread[static_cast<std::size_t>(workers - 1)]);
    KVCORE_CHECK_OR_RETURN_ERROR(workers == 1 || pool->threads_ != nullptr, MemoryAllocationFailed,
                                 "WorkerPool: out of memory");
    for (int w = 1; w < workers; ++w) {
      Thread& t = pool->threads_[static_cast<std::size_t>(w - 1)];
      t.pool = pool.get();
      t.worker = w;
      const int failed = pthread_create(&t.id, nullptr, &WorkerPool::main, &t);
      KVCORE_CHECK_OR_RETURN_ERROR(failed == 0, MemoryAllocationFailed,
                                   "WorkerPool: thread %d of %d could not be started (pthread_create: %d)", w,
                                   workers - 1, failed);
      pool->started_ = w;  // the destructor stops the ones started
    }
    pool->workers_ = workers;
    return pool;
  }

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Stops and joins the threads (waits for none: no job runs while the pool is destroyed).
  ~WorkerPool() {
    pthread_mutex_lock(&mutex_);
    stop_ = true;
    pthread_mutex_unlock(&mutex_);
    pthread_cond_broadcast(&wake_);
    for (int w = 1; w <= started_; ++w) pthread_join(threads_[static_cast<std::size_t>(w - 1)].id, nullptr);
    pthread_cond_destroy(&wake_);
    pthread_cond_destroy(&finished_);
    pthread_mutex_destroy(&mutex_);
  }

  /// The workers `threads` asks for: itself when positive, else (0) the processors online
  /// (sysconf), at most kMaxWorkers. Negative stays negative (create refuses it).
  static int resolve(int threads) noexcept {
    if (threads != 0) return threads;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online < 1 ? 1 : online > kMaxWorkers ? kMaxWorkers : static_cast<int>(online);
  }

  /// Workers (the caller counted).
  int workers() const noexcept { return workers_; }

  /// Runs fn(context, task, worker) for every task in [0, n_tasks) and returns when all
  /// are done. The caller works too, so a job finishes even while the threads are not
  /// scheduled; tasks are claimed one at a time, so which worker runs which task varies.
  /// One job at a time (one thread calls run). Allocates nothing.
  void run(int n_tasks, TaskFn fn, void* context) noexcept {
    if (n_tasks <= 0) return;
    if (n_tasks == 1 || workers_ == 1) {
      for (int i = 0; i < n_tasks; ++i) fn(context, i, 0);
      return;
    }
    pthread_mutex_lock(&mutex_);
    const std::uint32_t generation = ++generation_;
    job_ = Job{fn, context, n_tasks};
    done_.store(0, std::memory_order_relaxed);
    next_.store(static_cast<std::uint64_t>(generation) << 32, std::memory_order_release);
    pthread_mutex_unlock(&mutex_);
    pthread_cond_broadcast(&wake_);
    work(generation, job_, 0);
    // The tasks left are running on other workers: short, so spin a while before sleeping.
    for (int spin = 0; spin < kSpins && done_.load(std::memory_order_acquire) < n_tasks; ++spin) pause();
    if (done_.load(std::memory_order_acquire) < n_tasks) {
      pthread_mutex_lock(&mutex_);
      while (done_.load(std::memory_order_acquire) < n_tasks) pthread_cond_wait(&finished_, &mutex_);
      pthread_mutex_unlock(&mutex_);
    }
  }

 private:
  struct Job {
    TaskFn fn = nullptr;
    void* context = nullptr;
    int n_tasks = 0;
  };
  struct Thread {
    pthread_t id{};
    WorkerPool* pool = nullptr;
    int worker = 0;
  };

  WorkerPool() noexcept = default;

  // Spin-wait rounds (about 20-50 us) before a worker sleeps or the caller waits asleep.
  static constexpr int kSpins = 1000;

  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
  }

  // Claims and runs the tasks of job `generation` until none is left. A task is claimed
  // with the job's generation in the same word, so a thread waking late for a finished job
  // claims nothing of the next one.
  void work(std::uint32_t generation, const Job& job, int worker) noexcept {
    for (;;) {
      std::uint64_t cur = next_.load(std::memory_order_acquire);
      if (static_cast<std::uint32_t>(cur >> 32) != generation) return;
      const int task = static_cast<int>(cur & 0xffffffffu);
      if (task >= job.n_tasks) return;
      if (!next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) continue;
      job.fn(job.context, task, worker);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == job.n_tasks) {
        pthread_mutex_lock(&mutex_);  // the caller checks done_ under the lock: no lost wake-up
        pthread_mutex_unlock(&mutex_);
        pthread_cond_signal(&finished_);
      }
    }
  }

  static void* main(void* arg) noexcept {
    Thread& self = *static_cast<Thread*>(arg);
    WorkerPool& pool = *self.pool;
    std::uint32_t seen = 0;
    for (;;) {
      // A layer's job follows the last one closely: watch for it a while before sleeping.
      for (int spin = 0; spin < kSpins; ++spin) {
        if (static_cast<std::uint32_t>(pool.next_.load(std::memory_order_acquire) >> 32) != seen) break;
        pause();
      }
      pthread_mutex_lock(&pool.mutex_);
      while (!pool.stop_ && pool.generation_ == seen) pthread_cond_wait(&pool.wake_, &pool.mutex_);
      if (pool.stop_) {
        pthread_mutex_unlock(&pool.mutex_);
        return nullptr;
      }
      seen = pool.generation_;
      const Job job = pool.job_;
      pthread_mutex_unlock(&pool.mutex_);
      pool.work(seen, job, self.worker);
    }
  }

  pthread_mutex_t mutex_ = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t wake_ = PTHREAD_COND_INITIALIZER;      // a job was posted, or stop
  pthread_cond_t finished_ = PTHREAD_COND_INITIALIZER;  // the job's last task finished
  std::uint32_t generation_ = 0;                        // jobs posted (under mutex_)
  Job job_;                                             // the current job (under mutex_)
  bool stop_ = false;                                   // (under mutex_)
  std::atomic<std::uint64_t> next_{0};                  // generation << 32 | next task to claim
  std::atomic<int> done_{0};                            // tasks of the current job finished
  std::unique_ptr<Thread[]> threads_;
  int started_ = 0;
  int workers_ = 1;
};

}  // namespace et
}  // namespace kvcore
