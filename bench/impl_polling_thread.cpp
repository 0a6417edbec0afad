// bench/impl_polling_thread.cpp: "polling_thread", a reference for the
// latency workload only, not a pool. One thread polls a single-producer
// ring and runs each task as soon as it sees it; it never sleeps, wakes
// nobody and shares its queue with no other consumer. Its sched p99 in a
// round is what the machine gives a consumer that never leaves its CPU:
// the floor under the pools' tails in the same round (docs/notes/2026-11-24-latency-tail.md,
// "Where the latency tail comes from").
//
// Data flow: the producer (the one thread the latency workload submits
// from) writes a slot's callable and then its `full` flag (release); the
// consumer reads the flag (acquire), runs and destroys the callable, and
// clears the flag (release) for the producer's next lap. A producer a whole
// ring ahead waits for the consumer.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "harness.hpp"

namespace bench {
namespace {

class PollingThread {
 public:
  static constexpr std::string_view kName = "polling_thread";
  static constexpr std::string_view kAllocNote = "";
  static constexpr bool kLatency = true;

  PollingThread() : slots_(std::make_unique<Slot[]>(kSlots)), consumer_([this] { consume(); }) {}
  PollingThread(const PollingThread&) = delete;
  PollingThread& operator=(const PollingThread&) = delete;
  // Runs what is still queued, then stops the thread.
  ~PollingThread() {
    stop_.store(true, std::memory_order_release);
    consumer_.join();
  }

  // One producer thread at a time (the latency workload has one).
  template <class F>
  void post(F&& f) {
    using D = std::decay_t<F>;
    Slot& s = slots_[head_++ & (kSlots - 1)];
    while (s.full.load(std::memory_order_acquire)) cpu_relax();  // a lap ahead
    if constexpr (sizeof(D) <= sizeof(s.buf) && alignof(D) <= alignof(Slot)) {
      ::new (static_cast<void*>(s.buf)) D(std::forward<F>(f));
      s.run = [](void* p) {
        D* fn = std::launder(static_cast<D*>(p));
        (*fn)();
        fn->~D();
      };
    } else {  // too big to sit in the slot: boxed
      ::new (static_cast<void*>(s.buf)) D*(new D(std::forward<F>(f)));
      s.run = [](void* p) {
        std::unique_ptr<D> fn(*std::launder(static_cast<D**>(p)));
        (*fn)();
      };
    }
    s.full.store(true, std::memory_order_release);
  }
  template <class Fn>
  void produce(Fn&& fn) {
    fn();
  }
  static std::string_view skip_reason(Workload /*w*/) {
    return "a reference for the latency workload only (one polling thread, not a pool)";
  }

 private:
  static constexpr std::size_t kSlots = std::size_t{1} << 16;  // 4 MiB

  struct alignas(64) Slot {
    std::atomic<bool> full{false};
    void (*run)(void*) = nullptr;
    alignas(16) unsigned char buf[48];
  };
  static_assert(sizeof(Slot) == 64);

  void consume() {
    for (std::uint64_t tail = 0;; ++tail) {
      Slot& s = slots_[tail & (kSlots - 1)];
      while (!s.full.load(std::memory_order_acquire)) {
        if (stop_.load(std::memory_order_acquire) && !s.full.load(std::memory_order_acquire)) {
          return;
        }
        cpu_relax();
      }
      s.run(s.buf);
      s.full.store(false, std::memory_order_release);
    }
  }

  std::unique_ptr<Slot[]> slots_;
  std::uint64_t head_ = 0;  // the producer's
  std::atomic<bool> stop_{false};
  std::thread consumer_;  // last: starts once the ring exists
};

}  // namespace

std::unique_ptr<Impl> make_polling_thread_impl() {
  return std::make_unique<AdapterImpl<PollingThread>>();
}

}  // namespace bench
