// Tests of the Prometheus text exposition writer (crew/metrics.hpp:
// text_exposition, append_text_exposition), on hand-built families: the
// HELP and TYPE lines, label rendering and escaping, each metric type's
// sample lines, number spelling, and agreement with prometheus-cpp's
// TextSerializer, the reference it must match byte for byte.
#include <gtest/gtest.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "crew/metrics.hpp"

namespace crew {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr double kInf = std::numeric_limits<double>::infinity();

MetricFamily family_of(std::string name, std::string help, MetricType type,
                       std::vector<ClientMetric> metrics) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  f.metric = std::move(metrics);
  return f;
}

ClientMetric gauge(double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

ClientMetric histogram(std::vector<ClientMetric::Bucket> buckets, std::uint64_t count, double sum,
                       std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.histogram.bucket = std::move(buckets);
  m.histogram.sample_count = count;
  m.histogram.sample_sum = sum;
  return m;
}

TEST(TextExposition, WritesWhatTextSerializerWritesForEveryType) {
  ClientMetric counter_metric;
  counter_metric.label = {{"pool", "a\"b\\c\nd"}, {"task", "x"}};
  counter_metric.counter.value = 42;
  ClientMetric big;
  big.counter.value = 123456789012345;
  big.timestamp_ms = 1700000000000;
  ClientMetric gauge_metric;
  gauge_metric.gauge.value = -0.5;
  ClientMetric untyped;
  untyped.label = {{"k", "v"}};
  untyped.untyped.value = 0.0001;
  ClientMetric summary;
  summary.label = {{"k", "v"}};
  summary.summary.sample_count = 3;
  summary.summary.sample_sum = 1.5;
  summary.summary.quantile = {{0.5, 0.25}, {0.99, 1e-05}};
  ClientMetric hist;
  hist.label = {{"pool", "p"}};
  hist.histogram.sample_count = 7;
  hist.histogram.sample_sum = 2.5;
  hist.histogram.bucket = {
      {1, 1e-05}, {2, 0.0001}, {3, 0.025}, {4, 60}, {7, std::numeric_limits<double>::infinity()}};
  const std::vector<MetricFamily> all = {
      family_of("c_total", "A counter.", MetricType::Counter, {counter_metric, big}),
      family_of("g", "A gauge.", MetricType::Gauge, {gauge_metric}),
      family_of("u", "Untyped.", MetricType::Untyped, {untyped}),
      family_of("s", "A summary.", MetricType::Summary, {summary}),
      family_of("h_seconds", "A histogram.", MetricType::Histogram, {hist, hist}),
  };
  EXPECT_EQ(text_exposition(all), prometheus::TextSerializer().Serialize(all));
  std::string appended = "# before\n";
  append_text_exposition(appended, all);
  EXPECT_EQ(appended, "# before\n" + text_exposition(all));
}

TEST(TextExposition, NumbersRoundTripAndSpecialValuesUsePrometheusSpelling) {
  ClientMetric m;
  auto line = [&](double v) {
    m.gauge.value = v;
    const std::string text = text_exposition({family_of("g", "h", MetricType::Gauge, {m})});
    const std::string last = text.substr(text.rfind("g ") + 2);
    return last.substr(0, last.size() - 1);
  };
  EXPECT_EQ(line(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(line(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(line(0.1 + 0.2), "0.30000000000000004");  // TextSerializer: 0.3
  EXPECT_EQ(line(1e16), "1e+16");
  EXPECT_EQ(line(1e15), "1000000000000000");
  EXPECT_EQ(line(1.5e-05), "1.5e-05");
  EXPECT_EQ(line(0), "0");
  // HELP escapes backslash and newline (TextSerializer writes them raw,
  // which breaks the line).
  EXPECT_EQ(text_exposition({family_of("g", "a\\b\n\"c\"", MetricType::Gauge, {})}),
            "# HELP g a\\\\b\\n\"c\"\n# TYPE g gauge\n");
}

TEST(TextExposition, NoFamiliesWriteNothingAndAppendingKeepsWhatWasThere) {
  EXPECT_EQ(text_exposition({}), "");
  std::string out = "kept\n";
  append_text_exposition(out, {});
  EXPECT_EQ(out, "kept\n");
  append_text_exposition(out, {family_of("g", "h", MetricType::Gauge, {gauge(1)})});
  EXPECT_EQ(out, "kept\n# HELP g h\n# TYPE g gauge\ng 1\n");
}

TEST(TextExposition, EachFamilyHasHelpAndTypeOnceThenOneLinePerSample) {
  const std::string text = text_exposition({
      family_of("a", "First.", MetricType::Gauge, {gauge(1, {{"k", "x"}}), gauge(2, {{"k", "y"}})}),
      family_of("b_total", "Second.", MetricType::Counter, {}),
      family_of("c", "Third.", MetricType::Untyped, {}),
  });
  EXPECT_EQ(text,
            "# HELP a First.\n# TYPE a gauge\n"
            "a{k=\"x\"} 1\n"
            "a{k=\"y\"} 2\n"
            "# HELP b_total Second.\n# TYPE b_total counter\n"
            "# HELP c Third.\n# TYPE c untyped\n");
}

TEST(TextExposition, LabelsKeepTheirOrderAndEscapeBackslashQuoteAndNewlineOnly) {
  const std::string text = text_exposition(
      {family_of("g", "h", MetricType::Gauge,
                 {gauge(3, {{"z", "last"}, {"a", "back\\slash \"quoted\"\nnew line\ttab {}=,"}}),
                  gauge(4, {{"empty", ""}})})});
  EXPECT_EQ(text,
            "# HELP g h\n# TYPE g gauge\n"
            "g{z=\"last\",a=\"back\\\\slash \\\"quoted\\\"\\nnew line\ttab {}=,\"} 3\n"
            "g{empty=\"\"} 4\n");
}

TEST(TextExposition, ATimestampFollowsTheValueInMilliseconds) {
  ClientMetric m = gauge(0.5, {{"k", "v"}});
  m.timestamp_ms = 1700000000123;
  EXPECT_EQ(text_exposition({family_of("g", "h", MetricType::Gauge, {m})}),
            "# HELP g h\n# TYPE g gauge\ng{k=\"v\"} 0.5 1700000000123\n");
}

TEST(TextExposition, HistogramsWriteCountSumThenCumulativeBucketsWithLeLast) {
  const ClientMetric unlabelled = histogram({{1, 0.005}, {3, 1}, {4, kInf}}, 4, 2.25);
  const ClientMetric labelled =
      histogram({{0, 1e-05}, {2, 60}, {2, kInf}}, 2, 61, {{"pool", "p"}, {"task", "t"}});
  EXPECT_EQ(text_exposition(
                {family_of("h_seconds", "Times.", MetricType::Histogram, {unlabelled, labelled})}),
            "# HELP h_seconds Times.\n# TYPE h_seconds histogram\n"
            "h_seconds_count 4\n"
            "h_seconds_sum 2.25\n"
            "h_seconds_bucket{le=\"0.005\"} 1\n"
            "h_seconds_bucket{le=\"1\"} 3\n"
            "h_seconds_bucket{le=\"+Inf\"} 4\n"
            "h_seconds_count{pool=\"p\",task=\"t\"} 2\n"
            "h_seconds_sum{pool=\"p\",task=\"t\"} 61\n"
            "h_seconds_bucket{pool=\"p\",task=\"t\",le=\"1e-05\"} 0\n"
            "h_seconds_bucket{pool=\"p\",task=\"t\",le=\"60\"} 2\n"
            "h_seconds_bucket{pool=\"p\",task=\"t\",le=\"+Inf\"} 2\n");
}

// Bounds are formatted once per family and reused while they repeat: a
// histogram of the same family with other bounds must still show its own.
TEST(TextExposition, HistogramsOfOneFamilyWithDifferentBoundsShowTheirOwn) {
  const ClientMetric first = histogram({{1, 0.1}, {2, 0.5}, {3, kInf}}, 3, 1);
  const ClientMetric second = histogram({{1, 0.1}, {2, 0.25}, {3, 2}, {4, kInf}}, 4, 3);
  const ClientMetric third = histogram({{5, kInf}}, 5, 4);
  const std::vector<MetricFamily> all = {
      family_of("h", "H.", MetricType::Histogram, {first, second, third, first})};
  const std::string text = text_exposition(all);
  EXPECT_EQ(text, prometheus::TextSerializer().Serialize(all));
  EXPECT_NE(text.find("h_bucket{le=\"0.25\"} 2\nh_bucket{le=\"2\"} 3\nh_bucket{le=\"+Inf\"} 4\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("h_sum 4\nh_bucket{le=\"+Inf\"} 5\n"), std::string::npos) << text;
}

TEST(TextExposition, SummariesWriteCountSumThenOneLinePerQuantile) {
  ClientMetric m;
  m.label = {{"k", "v"}};
  m.summary.sample_count = 10;
  m.summary.sample_sum = 0.75;
  m.summary.quantile = {{0.5, 0.05}, {0.999, 0.5}};
  EXPECT_EQ(text_exposition({family_of("s", "S.", MetricType::Summary, {m})}),
            "# HELP s S.\n# TYPE s summary\n"
            "s_count{k=\"v\"} 10\n"
            "s_sum{k=\"v\"} 0.75\n"
            "s{k=\"v\",quantile=\"0.5\"} 0.05\n"
            "s{k=\"v\",quantile=\"0.999\"} 0.5\n");
}

// The output is sized from an estimate first; lines longer than it (a huge
// label value, a long HELP) and many lines must still come out whole.
TEST(TextExposition, LongLabelsAndManyLinesComeOutWhole) {
  const std::string huge(100'000, 'x');
  std::vector<ClientMetric> many;
  for (int i = 0; i < 20'000; ++i) many.push_back(gauge(i, {{"i", std::to_string(i)}}));
  const std::vector<MetricFamily> all = {
      family_of("long", std::string(50'000, 'h'), MetricType::Gauge, {gauge(1, {{"v", huge}})}),
      family_of("many", "Many.", MetricType::Gauge, std::move(many)),
  };
  const std::string text = text_exposition(all);
  EXPECT_EQ(text, prometheus::TextSerializer().Serialize(all));
  EXPECT_NE(text.find("long{v=\"" + huge + "\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("\nmany{i=\"19999\"} 19999\n"), std::string::npos);
}

}  // namespace
}  // namespace crew
