// service/metrics/readiness_metrics.hpp: crewd's readiness as a metric.
//
//   crewd_ready   gauge: 1 while /readyz answers 200, 0 while it answers 503
//                 (halting, or a readiness check failing: Redis disconnected)
//
// The probe is the HTTP server's own (HttpServer::not_ready_reason), set
// once the server exists; the collectable is made before it because the
// server is built with the list of collectables it serves. Until a probe
// is set the gauge is left out of a scrape.
//
// Thread safety: set_probe() and Collect() may run on any threads,
// concurrently; the probe runs on the scraping thread, under a lock that
// only set_probe() also takes.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace crewd {

class ReadinessMetrics final : public prometheus::Collectable {
 public:
  // `probe` returns why crewd is not ready, or an empty string when it is.
  // It must stay callable until the last Collect().
  void set_probe(std::function<std::string()> probe);

  [[nodiscard]] std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mu_;
  std::function<std::string()> probe_;  // guarded by mu_
};

}  // namespace crewd
