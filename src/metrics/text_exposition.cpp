// The Prometheus text exposition format, version 0.0.4 (crew/metrics.hpp:
// append_text_exposition, text_exposition).
//
// Owns nothing between calls: a call turns the families it is given into
// lines appended to the caller's string, so it is safe on any thread, and
// concurrently with itself on different strings. It knows only
// prometheus::MetricFamily, not crew's pools; the exporter (metrics.cpp)
// builds the families it serializes.
//
// Data flow, per family: the HELP and TYPE lines; per metric, its labels
// rendered once (`a="x",b="y"`), then each sample line written through a
// LineWriter that makes room for the line's longest form and copies without
// a check per character. Numbers are std::to_chars in shortest round-trip
// form, spelled as TextSerializer spells them (tests/metrics/text_exposition_test.cpp
// compares the two byte for byte).
#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "crew/metrics.hpp"

namespace crew {
namespace detail::prom {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricType;

// Room every number needs: the longest shortest-round-trip double
// ("-1.2345678901234567e-308") or int64 is 24 characters.
constexpr std::size_t kNumberRoom = 32;

// Shortest round-trip digits, in the style of printf's %g (and of
// TextSerializer, whose bucket bounds become `le` label values that queries
// match as strings): fixed notation for exponents -4 .. 15, so 0.0001, 60
// and integer counts read naturally; scientific otherwise (1e-05). Writes at
// most kNumberRoom characters at `p`.
char* put_number(char* p, double v) {
  const std::string_view special = std::isnan(v)   ? "NaN"
                                   : std::isinf(v) ? (v < 0 ? "-Inf" : "+Inf")
                                                   : std::string_view();
  if (!special.empty()) return std::copy(special.begin(), special.end(), p);
  auto r = std::to_chars(p, p + kNumberRoom, v, std::chars_format::scientific);
  const char* e = std::find(p, r.ptr, 'e');
  int exp = 0;
  if (e != r.ptr) std::from_chars(e + (e[1] == '+' ? 2 : 1), r.ptr, exp);
  if (exp >= -4 && exp < 16) r = std::to_chars(p, p + kNumberRoom, v, std::chars_format::fixed);
  return r.ptr;
}

char* put_number(char* p, std::uint64_t v) { return std::to_chars(p, p + kNumberRoom, v).ptr; }
char* put_number(char* p, std::int64_t v) { return std::to_chars(p, p + kNumberRoom, v).ptr; }

char* put(char* p, std::string_view s) {
  std::memcpy(p, s.data(), s.size());
  return p + s.size();
}

// Label values escape backslash, double quote and newline; HELP text
// backslash and newline. Runs without special characters are copied whole.
void append_escaped(std::string& out, std::string_view s, bool label) {
  const std::string_view special = label ? std::string_view("\\\n\"") : std::string_view("\\\n");
  for (std::size_t at = s.find_first_of(special); at != std::string_view::npos;
       at = s.find_first_of(special)) {
    out.append(s.substr(0, at));
    out += s[at] == '\n' ? "\\n" : s[at] == '"' ? "\\\"" : "\\\\";
    s.remove_prefix(at + 1);
  }
  out.append(s);
}

// A metric's labels as `a="x",b="y"`, rendered once for all its lines.
void render_labels(std::string& out, const ClientMetric& m) {
  out.clear();
  for (const ClientMetric::Label& l : m.label) {
    if (!out.empty()) out += ',';
    out += l.name;
    out += "=\"";
    append_escaped(out, l.value, true);
    out += '"';
  }
}

// Appends lines to a string through a raw pointer: each line makes room for
// its longest form first, then copies without a check per character.
class LineWriter {
 public:
  explicit LineWriter(std::string& out) : out_(out), used_(out.size()) {}
  ~LineWriter() { out_.resize(used_); }
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;

  // At least `n` writable bytes at the returned position.
  char* room(std::size_t n) {
    if (out_.size() - used_ < n) out_.resize(std::max(2 * out_.size(), used_ + n));
    return out_.data() + used_;
  }
  void done(char* end) { used_ = static_cast<std::size_t>(end - out_.data()); }

  // `name[suffix]{labels[,extra="value"]} value[ timestamp]\n`; `labels`
  // comes from render_labels, `extra_value` is already formatted.
  template <class V>
  void sample(const std::string& name, std::string_view suffix, std::string_view labels,
              const ClientMetric& m, V value, std::string_view extra = {},
              std::string_view extra_value = {}) {
    char* p = room(name.size() + suffix.size() + labels.size() + extra.size() + extra_value.size() +
                   2 * kNumberRoom + 8);
    p = put(p, name);
    p = put(p, suffix);
    if (!labels.empty() || !extra.empty()) {
      *p++ = '{';
      p = put(p, labels);
      if (!extra.empty()) {
        if (!labels.empty()) *p++ = ',';
        p = put(p, extra);
        p = put(p, "=\"");
        p = put(p, extra_value);
        *p++ = '"';
      }
      *p++ = '}';
    }
    *p++ = ' ';
    p = put_number(p, value);
    if (m.timestamp_ms != 0) {
      *p++ = ' ';
      p = put_number(p, static_cast<std::int64_t>(m.timestamp_ms));
    }
    *p++ = '\n';
    done(p);
  }

  // The first two lines of a summary or a histogram.
  void count_and_sum(const std::string& name, std::string_view labels, const ClientMetric& m,
                     std::uint64_t count, double sum) {
    sample(name, "_count", labels, m, count);
    sample(name, "_sum", labels, m, sum);
  }

 private:
  std::string& out_;
  std::size_t used_;  // bytes of out_ written; the rest is room
};

// A bound formatted once per family: the histograms of a family usually
// share their buckets.
class BoundText {
 public:
  std::string_view operator()(std::size_t i, double bound) {
    if (i >= text_.size()) {
      text_.resize(i + 1);
      value_.resize(i + 1, std::numeric_limits<double>::quiet_NaN());
    }
    if (!(value_[i] == bound)) {  // NaN never matches: formatted each time
      char buf[kNumberRoom];
      text_[i].assign(buf, put_number(buf, bound));
      value_[i] = bound;
    }
    return text_[i];
  }

 private:
  std::vector<std::string> text_;
  std::vector<double> value_;
};

// An upper estimate of the text's size, so that the output grows once.
std::size_t estimated_size(const std::vector<prometheus::MetricFamily>& families) {
  std::size_t bytes = 0;
  for (const prometheus::MetricFamily& f : families) {
    bytes += 2 * f.name.size() + f.help.size() + 32;
    for (const ClientMetric& m : f.metric) {
      std::size_t line = f.name.size() + 48;  // suffix, braces, value, timestamp
      for (const ClientMetric::Label& l : m.label) line += l.name.size() + l.value.size() + 4;
      std::size_t lines = 1;
      if (f.type == MetricType::Histogram) lines = m.histogram.bucket.size() + 2;
      if (f.type == MetricType::Summary) lines = m.summary.quantile.size() + 2;
      bytes += lines * (line + 32);  // + an extra label
    }
  }
  return bytes;
}

std::string_view type_name(MetricType t) {
  switch (t) {
    case MetricType::Counter:
      return "counter";
    case MetricType::Gauge:
      return "gauge";
    case MetricType::Summary:
      return "summary";
    case MetricType::Histogram:
      return "histogram";
    case MetricType::Untyped:
      break;
  }
  return "untyped";
}

}  // namespace
}  // namespace detail::prom

namespace prom = detail::prom;

void append_text_exposition(std::string& out,
                            const std::vector<prometheus::MetricFamily>& families) {
  using prometheus::MetricType;
  out.reserve(out.size() + prom::estimated_size(families));
  std::string help;
  std::string labels;
  prom::LineWriter w(out);
  for (const prometheus::MetricFamily& f : families) {
    help.clear();
    prom::append_escaped(help, f.help, false);
    const std::string_view type = prom::type_name(f.type);
    char* p = w.room(2 * f.name.size() + help.size() + type.size() + 20);
    p = prom::put(p, "# HELP ");
    p = prom::put(p, f.name);
    *p++ = ' ';
    p = prom::put(p, help);
    p = prom::put(p, "\n# TYPE ");
    p = prom::put(p, f.name);
    *p++ = ' ';
    p = prom::put(p, type);
    *p++ = '\n';
    w.done(p);
    prom::BoundText bounds;
    for (const prometheus::ClientMetric& m : f.metric) {
      prom::render_labels(labels, m);
      switch (f.type) {
        case MetricType::Counter:
          w.sample(f.name, "", labels, m, m.counter.value);
          break;
        case MetricType::Gauge:
          w.sample(f.name, "", labels, m, m.gauge.value);
          break;
        case MetricType::Untyped:
          w.sample(f.name, "", labels, m, m.untyped.value);
          break;
        case MetricType::Summary:
          w.count_and_sum(f.name, labels, m, m.summary.sample_count, m.summary.sample_sum);
          for (std::size_t i = 0; i < m.summary.quantile.size(); ++i) {
            const auto& q = m.summary.quantile[i];
            w.sample(f.name, "", labels, m, q.value, "quantile", bounds(i, q.quantile));
          }
          break;
        case MetricType::Histogram:
          w.count_and_sum(f.name, labels, m, m.histogram.sample_count, m.histogram.sample_sum);
          for (std::size_t i = 0; i < m.histogram.bucket.size(); ++i) {
            const auto& b = m.histogram.bucket[i];
            w.sample(f.name, "_bucket", labels, m, b.cumulative_count, "le",
                     bounds(i, b.upper_bound));
          }
          break;
      }
    }
  }
}

std::string text_exposition(const std::vector<prometheus::MetricFamily>& families) {
  std::string out;
  append_text_exposition(out, families);
  return out;
}

}  // namespace crew
