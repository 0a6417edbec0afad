// service/http_metrics.hpp: crewd's HTTP request metrics.
//
//   crewd_http_requests_total{route,status}            counter
//   crewd_http_request_duration_seconds{route,status}  histogram
//   crewd_http_connections                              gauge (open now)
//   crewd_http_connections_total                        counter (accepted)
//
// `route` is the route's pattern ("/api/v1/factorial/{n}"), or "unmatched"
// for a 404, so the label set stays bounded whatever clients send.
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
#include <string_view>
#include <vector>

namespace crewd {

// The routes crewd serves; `unmatched` counts requests for unknown paths.
enum class Route : std::uint8_t {
  factorial,
  jobs,
  pools,
  metrics,
  healthz,
  readyz,
  unmatched,
};
inline constexpr std::size_t kRouteCount = 7;

// The pattern of a route, as in docs/crewd.md and the `route` label.
[[nodiscard]] std::string_view route_pattern(Route r) noexcept;

class RequestMetrics final : public prometheus::Collectable {
 public:
  RequestMetrics();
  ~RequestMetrics() override;
  RequestMetrics(const RequestMetrics&) = delete;
  RequestMetrics& operator=(const RequestMetrics&) = delete;

  // A response was written. Statuses outside 100..599 count as 500.
  void observe(Route route, int status, std::chrono::nanoseconds latency) noexcept;
  void connection_opened() noexcept;
  void connection_closed() noexcept;

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
  Series& series(Route route, int status) noexcept;

  // Allocated on first use, never freed before the object: a status code is
  // one of a few hundred, so the table is small and lookups need no lock.
  std::array<std::array<std::atomic<Series*>, kMaxStatus - kMinStatus + 1>, kRouteCount> table_{};
  std::atomic<std::int64_t> open_connections_{0};
  std::atomic<std::uint64_t> accepted_connections_{0};
};

}  // namespace crewd
