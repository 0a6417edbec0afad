#include "metrics/http_metrics.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "metrics/metric_family.hpp"

namespace crewd {

std::string_view to_string(CloseReason r) noexcept {
  switch (r) {
    case CloseReason::client:
      return "client";
    case CloseReason::server:
      return "server";
    case CloseReason::bad_request:
      return "bad_request";
    case CloseReason::idle_timeout:
      return "idle_timeout";
    case CloseReason::head_timeout:
      return "head_timeout";
    case CloseReason::body_timeout:
      return "body_timeout";
    case CloseReason::write_timeout:
      return "write_timeout";
    case CloseReason::evicted:
      return "evicted";
    case CloseReason::refused:
      return "refused";
    case CloseReason::shutdown:
      return "shutdown";
  }
  return "client";
}

namespace {

std::vector<std::string> with_unmatched(std::vector<std::string> routes) {
  routes.emplace_back("unmatched");
  return routes;
}

}  // namespace

RequestMetrics::RequestMetrics(std::vector<std::string> routes)
    : routes_(with_unmatched(std::move(routes))), table_(std::make_unique<Row[]>(routes_.size())) {}

RequestMetrics::~RequestMetrics() {
  for (std::size_t r = 0; r < routes_.size(); ++r) {
    for (auto& cell : table_[r]) delete cell.load(std::memory_order_acquire);
  }
}

RequestMetrics::Series& RequestMetrics::series(std::size_t route, int status) noexcept {
  if (status < kMinStatus || status > kMaxStatus) status = 500;
  route = std::min(route, routes_.size() - 1);  // past the routes: unmatched
  auto& cell = table_[route][static_cast<std::size_t>(status - kMinStatus)];
  Series* s = cell.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  // First response with this route and status: publish a new series; a
  // thread that loses the race frees its copy and uses the winner's.
  auto* fresh = new Series();
  if (cell.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *s;
}

void RequestMetrics::observe(std::size_t route, int status,
                             std::chrono::nanoseconds latency) noexcept {
  Series& s = series(route, status);
  const double seconds = std::chrono::duration<double>(latency).count();
  std::size_t b = 0;
  while (b < kBuckets.size() && seconds > kBuckets[b]) ++b;
  s.buckets[b].fetch_add(1, std::memory_order_relaxed);
  s.sum_ns.fetch_add(static_cast<std::uint64_t>(latency.count() < 0 ? 0 : latency.count()),
                     std::memory_order_relaxed);
}

void RequestMetrics::connection_opened() noexcept {
  accepted_connections_.fetch_add(1, std::memory_order_relaxed);
  open_connections_.fetch_add(1, std::memory_order_relaxed);
}

void RequestMetrics::connection_closed(CloseReason why) noexcept {
  open_connections_.fetch_sub(1, std::memory_order_relaxed);
  closed_[static_cast<std::size_t>(why)].fetch_add(1, std::memory_order_relaxed);
}

std::vector<prometheus::MetricFamily> RequestMetrics::Collect() const {
  prometheus::MetricFamily requests{"crewd_http_requests_total",
                                    "HTTP responses written, by route pattern and status code",
                                    prometheus::MetricType::Counter,
                                    {}};
  prometheus::MetricFamily durations{
      "crewd_http_request_duration_seconds",
      "Time from a request's parsed head to its response handed to the socket, by route and "
      "status",
      prometheus::MetricType::Histogram,
      {}};
  for (std::size_t r = 0; r < routes_.size(); ++r) {
    for (std::size_t i = 0; i < table_[r].size(); ++i) {
      const Series* s = table_[r][i].load(std::memory_order_acquire);
      if (s == nullptr) continue;
      const std::vector<prometheus::ClientMetric::Label> labels = {
          {"route", routes_[r]}, {"status", std::to_string(static_cast<int>(i) + kMinStatus)}};
      // The count is the sum of the buckets, so the +Inf bucket always equals
      // it, even when a scrape races an observation.
      prometheus::ClientMetric h;
      h.label = labels;
      std::uint64_t cumulative = 0;
      for (std::size_t b = 0; b <= kBuckets.size(); ++b) {
        cumulative += s->buckets[b].load(std::memory_order_relaxed);
        h.histogram.bucket.push_back({cumulative, b < kBuckets.size()
                                                      ? kBuckets[b]
                                                      : std::numeric_limits<double>::infinity()});
      }
      h.histogram.sample_count = cumulative;
      h.histogram.sample_sum = static_cast<double>(s->sum_ns.load(std::memory_order_relaxed)) / 1e9;
      durations.metric.push_back(std::move(h));

      prometheus::ClientMetric c;
      c.label = labels;
      c.counter.value = static_cast<double>(cumulative);
      requests.metric.push_back(std::move(c));
    }
  }

  prometheus::MetricFamily open = one_sample_family(
      "crewd_http_connections", "Client connections open now", prometheus::MetricType::Gauge,
      static_cast<double>(open_connections_.load(std::memory_order_relaxed)));
  prometheus::MetricFamily accepted =
      one_sample_family("crewd_http_connections_total", "Client connections accepted",
                        prometheus::MetricType::Counter,
                        static_cast<double>(accepted_connections_.load(std::memory_order_relaxed)));

  prometheus::MetricFamily closed{"crewd_http_connections_closed_total",
                                  "Client connections crewd stopped serving, by reason",
                                  prometheus::MetricType::Counter,
                                  {}};
  for (std::size_t r = 0; r < kCloseReasonCount; ++r) {
    prometheus::ClientMetric c;
    c.label = {{"reason", std::string(to_string(static_cast<CloseReason>(r)))}};
    c.counter.value = static_cast<double>(closed_[r].load(std::memory_order_relaxed));
    closed.metric.push_back(std::move(c));
  }

  std::vector<prometheus::MetricFamily> out;
  out.push_back(std::move(requests));
  out.push_back(std::move(durations));
  out.push_back(std::move(open));
  out.push_back(std::move(accepted));
  out.push_back(std::move(closed));
  return out;
}

}  // namespace crewd
