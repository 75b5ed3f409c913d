// A minimal fork-join loop shared by the CPU backends.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace flash_kda::cpu {

// Calls body(i, scratch) once for every i in [0, n) on up to `threads` threads (0: all hardware
// threads), the calling thread included, and returns when every call has returned. Each thread owns
// one default-constructed Scratch, reused across its items so buffers are allocated once per thread.
//
// Items are claimed one at a time from an atomic counter, not in fixed slices: (sequence, head) items
// of a varlen batch differ in length by orders of magnitude. If the system refuses to start a thread,
// the loop runs on the threads it has. An exception thrown by body stops further items and is rethrown
// here after every thread has joined (one escaping a std::thread would terminate the process).
template <typename Scratch, typename Body>
void parallel_for(int64_t n, int threads, const Body& body) {
  if (n <= 0) return;
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const int64_t workers = std::min<int64_t>(threads > 0 ? threads : hardware, n);

  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
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

  std::vector<std::thread> pool;
  pool.reserve(size_t(workers - 1));
  for (int64_t t = 1; t < workers; ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flash_kda::cpu
