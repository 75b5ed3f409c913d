// The process-wide thread pool behind cpu::parallel_for (parallel.h).
#include "parallel.h"

#include <condition_variable>
#include <system_error>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace flash_kda::cpu::detail {
namespace {

thread_local bool t_in_job = false;  // this thread is running a job (a nested call runs inline)

// Parked worker threads. Never destroyed: its threads stay blocked in wait() until the process
// exits, so nothing has to be joined at exit (where a static destructor could wait on a thread the
// runtime already stopped).
class Pool {
 public:
  int run(int helpers, const std::function<void()>& job) {
    std::lock_guard<std::mutex> one_job(job_mutex_);
    helpers = grow(helpers);
    {
      std::lock_guard<std::mutex> lock(m_);
      job_ = &job;
      wanted_ = helpers;
      remaining_ = helpers;
      ++generation_;
    }
    if (helpers > 0) wake_.notify_all();
    t_in_job = true;
    job();
    t_in_job = false;
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
    return helpers;
  }

 private:
  // Starts threads until `helpers` exist (or the system refuses); returns how many can help.
  int grow(int helpers) {
    while (int(threads_) < helpers) {
      try {
        std::thread(&Pool::worker, this, int(threads_)).detach();
      } catch (const std::system_error&) {
        break;
      }
      ++threads_;
    }
    return std::min(helpers, int(threads_));
  }

  void worker(int index) {
    t_in_job = true;  // everything this thread runs is part of a job
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (index >= wanted_) continue;  // not needed for this job
      const std::function<void()>* job = job_;
      lock.unlock();
      (*job)();
      lock.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  std::mutex job_mutex_;  // held by the caller for a whole job
  std::mutex m_;          // guards the fields below
  std::condition_variable wake_, done_;
  size_t threads_ = 0;  // started (only changed under job_mutex_)
  uint64_t generation_ = 0;
  int wanted_ = 0, remaining_ = 0;
  const std::function<void()>* job_ = nullptr;
};

std::atomic<Pool*> g_pool{nullptr};
std::once_flag g_init;

Pool& pool() {
  std::call_once(g_init, [] {
    g_pool.store(new Pool);
#if defined(__unix__) || defined(__APPLE__)
    // A child of fork() has none of the parent's pool threads (and maybe a locked job mutex): it
    // gets a fresh pool, the parent's is abandoned.
    pthread_atfork(nullptr, nullptr, [] { g_pool.store(new Pool); });
#endif
  });
  return *g_pool.load();
}

}  // namespace

int run_on_pool(int helpers, const std::function<void()>& job) {
  if (helpers <= 0 || t_in_job) {
    job();
    return 0;
  }
  return pool().run(helpers, job);
}

}  // namespace flash_kda::cpu::detail
