// crewd_ready (service/metrics/readiness_metrics.hpp).
#include "metrics/readiness_metrics.hpp"

#include <utility>

#include "metrics/metric_family.hpp"

namespace crewd {

void ReadinessMetrics::set_probe(std::function<std::string()> probe) {
  const std::lock_guard lock(mu_);
  probe_ = std::move(probe);
}

std::vector<prometheus::MetricFamily> ReadinessMetrics::Collect() const {
  const std::lock_guard lock(mu_);
  if (!probe_) return {};
  return {one_sample_family("crewd_ready",
                            "Whether crewd takes traffic: 1 while /readyz answers 200, 0 while "
                            "it answers 503 (halting, or a readiness check failing)",
                            prometheus::MetricType::Gauge, probe_().empty() ? 1 : 0)};
}

}  // namespace crewd
