// bench/impl_asio.cpp: boost::asio::thread_pool with boost::asio::post, and
// asio's own use_future adapter for the handle workload.
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_future.hpp>
#include <memory>
#include <string_view>
#include <utility>

#include "harness.hpp"

namespace bench {
namespace {

struct Asio {
  static constexpr std::string_view kName = "asio";
  static constexpr std::string_view kAllocNote = "";
  static constexpr bool kLatency = true;

  boost::asio::thread_pool pool{kWorkers};

  Asio() = default;
  Asio(const Asio&) = delete;
  Asio& operator=(const Asio&) = delete;
  // The destructor would stop() first and drop queued handlers; the workloads
  // have waited for all their tasks, so join() returns at once.
  ~Asio() { pool.join(); }

  template <class F>
  void post(F&& f) {
    boost::asio::post(pool, std::forward<F>(f));
  }
  template <class F>
  auto submit(F&& f) {
    return boost::asio::post(pool, boost::asio::use_future(std::forward<F>(f)));
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

std::unique_ptr<Impl> make_asio_impl() { return std::make_unique<AdapterImpl<Asio>>(); }

}  // namespace bench
