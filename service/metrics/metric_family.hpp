// service/metrics/metric_family.hpp: a Prometheus family of one unlabelled sample,
// for crewd's collectors (http_metrics.cpp, process_metrics.cpp). A pure
// function: any thread.
#pragma once

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <string>

namespace crewd {

// `value` as a counter's or, for any other type, a gauge's value.
inline prometheus::MetricFamily one_sample_family(std::string name, std::string help,
                                                  prometheus::MetricType type, double value) {
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return prometheus::MetricFamily{std::move(name), std::move(help), type, {m}};
}

}  // namespace crewd
