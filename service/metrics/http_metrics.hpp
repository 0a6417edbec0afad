// service/metrics/http_metrics.hpp: crewd's HTTP request metrics.
//
//   crewd_http_requests_total{route,status}            counter
//   crewd_http_request_duration_seconds{route,status}  histogram
//   crewd_http_connections                              gauge (open now)
//   crewd_http_connections_total                        counter (accepted)
//   crewd_http_connections_closed_total{reason}         counter (why crewd closed or
//                                                       stopped serving a connection)
//
// `route` is the route's pattern ("/api/v1/factorial/{n}"), or "unmatched"
// for a 404, so the label set stays bounded whatever clients send. The
// patterns are given at construction (http::route_labels(), from the route
// table in service/http/routes.cpp).
//
// Cost per request: two relaxed atomic adds on the (route, status) series;
// no lock, no allocation after a series' first use. Collect() reads the
// counters at scrape time.
//
// Thread safety: all member functions are thread-safe.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace crewd {

// Why a connection ended (the `reason` label of crewd_http_connections_closed_total).
enum class CloseReason : std::uint8_t {
  client,         // the client closed it, or it failed (reset, I/O error)
  server,         // after a response with Connection: close (asked for, HTTP/1.0,
                  // http.keep_alive_max, or crewd is halting)
  bad_request,    // after the error response to a request that could not be read
  idle_timeout,   // no request within http.keep_alive_timeout_s
  head_timeout,   // request head not complete within http.head_timeout_ms (408)
  body_timeout,   // request body not complete within http.body_timeout_ms (408)
  write_timeout,  // the client did not take the response within http.write_timeout_ms
  evicted,        // idle, closed to make room at http.max_connections
  refused,        // accepted at http.max_connections with nothing idle to evict (503)
  shutdown,       // idle when crewd stopped, or cut at the end of the stop
};
inline constexpr std::size_t kCloseReasonCount = 10;
[[nodiscard]] std::string_view to_string(CloseReason r) noexcept;

class RequestMetrics final : public prometheus::Collectable {
 public:
  // `routes`: the `route` label of each route; observe()'s `route` indexes
  // it, and any index past its end counts as "unmatched".
  explicit RequestMetrics(std::vector<std::string> routes);
  ~RequestMetrics() override;
  RequestMetrics(const RequestMetrics&) = delete;
  RequestMetrics& operator=(const RequestMetrics&) = delete;

  // A response is about to be written (counted before it is sent, so that a
  // client that has read it finds it counted). Statuses outside 100..599
  // count as 500.
  void observe(std::size_t route, int status, std::chrono::nanoseconds latency) noexcept;
  void connection_opened() noexcept;
  // The connection stopped being served (it may linger a moment, draining,
  // before its socket is closed).
  void connection_closed(CloseReason why) noexcept;
  [[nodiscard]] std::int64_t open_connections() const noexcept {
    return open_connections_.load(std::memory_order_relaxed);
  }

  [[nodiscard]] std::vector<prometheus::MetricFamily> Collect() const override;

  // Upper bounds in seconds; +Inf is implicit.
  static constexpr std::array<double, 18> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                      1,      2.5,     5,      10,    30,     60};

 private:
  struct Series {
    std::atomic<std::uint64_t> sum_ns{0};
    std::array<std::atomic<std::uint64_t>, kBuckets.size() + 1> buckets{};  // last: +Inf
  };
  static constexpr int kMinStatus = 100;
  static constexpr int kMaxStatus = 599;
  using Row = std::array<std::atomic<Series*>, kMaxStatus - kMinStatus + 1>;
  Series& series(std::size_t route, int status) noexcept;

  // One label per route, then "unmatched".
  const std::vector<std::string> routes_;
  // One row per label. Series are allocated on first use, never freed
  // before the object: a status code is one of a few hundred, so the table
  // is small and lookups need no lock.
  const std::unique_ptr<Row[]> table_;
  std::atomic<std::int64_t> open_connections_{0};
  std::atomic<std::uint64_t> accepted_connections_{0};
  std::array<std::atomic<std::uint64_t>, kCloseReasonCount> closed_{};
};

}  // namespace crewd
