// A minimal fork-join loop shared by the CPU backends, on a process-wide pool of parked threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace flash_kda::cpu {

namespace detail {
// Runs job() on the calling thread and on up to `helpers` threads of a process-wide pool, and
// returns when every one of those calls has returned. The pool starts its threads on first use
// and keeps them parked between calls (starting threads on every call cost ~80 us). One job runs
// at a time: concurrent callers wait for the pool; a call made from inside a job (nested) runs
// job() on the calling thread alone. job must not throw. Returns the number of helpers that ran it
// (fewer than asked when the system refuses to start more threads).
int run_on_pool(int helpers, const std::function<void()>& job);
}  // namespace detail

// Calls body(i, scratch) once for every i in [0, n) on up to `threads` threads (0: all hardware
// threads), the calling thread included, and returns when every call has returned. Each thread owns
// one default-constructed Scratch, reused across its items so buffers are allocated once per thread
// and call.
//
// Items are claimed one at a time from an atomic counter, not in fixed slices: (sequence, head) items
// of a varlen batch differ in length by orders of magnitude. If the system refuses to start a thread,
// the loop runs on the threads it has. An exception thrown by body stops further items and is rethrown
// here after every thread has finished (one escaping a pool thread would terminate the process).
template <typename Scratch, typename Body>
void parallel_for(int64_t n, int threads, const Body& body) {
  if (n <= 0) return;
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const int64_t workers = std::min<int64_t>(threads > 0 ? threads : hardware, n);

  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  const std::function<void()> work = [&] {
    Scratch scratch{};
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      try {
        body(i, scratch);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n, std::memory_order_relaxed);
      }
    }
  };
  detail::run_on_pool(int(std::min<int64_t>(workers - 1, 1024)), work);
  if (error) std::rethrow_exception(error);
}

}  // namespace flash_kda::cpu
