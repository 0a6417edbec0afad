// bench/impl_thread_pool.cpp: Debian's libthread-pool-dev (rvaser's
// thread_pool::ThreadPool). Its only submission, Submit(), returns a
// std::future, so a detached post is a Submit whose future is dropped
// (destroying it does not block).
#include <memory>
#include <string_view>
#include <thread_pool/thread_pool.hpp>
#include <utility>

#include "harness.hpp"

namespace bench {
namespace {

struct ThreadPoolDeb {
  static constexpr std::string_view kName = "thread_pool_deb";
  static constexpr std::string_view kAllocNote = "";
  static constexpr bool kLatency = true;

  thread_pool::ThreadPool pool{kWorkers};

  template <class F>
  void post(F&& f) {
    (void)pool.Submit(std::forward<F>(f));
  }
  template <class F>
  auto submit(F&& f) {
    return pool.Submit(std::forward<F>(f));
  }
  template <class Fn>
  void produce(Fn&& fn) {
    fn();
  }
  static std::string_view skip_reason(Workload w) {
    return w == Workload::long_deadline ? "a crew feature (tasks with a deadline and a stop token)"
                                        : "";
  }
};

}  // namespace

std::unique_ptr<Impl> make_thread_pool_deb_impl() {
  return std::make_unique<AdapterImpl<ThreadPoolDeb>>();
}

}  // namespace bench
