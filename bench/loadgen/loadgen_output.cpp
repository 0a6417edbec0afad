// loadgen's output (loadgen.hpp): latency percentiles, the per-second
// lines and the JSON summary.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loadgen.hpp"

namespace loadgen {
namespace {

void append_percentiles(std::string& out, const Percentiles& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "{\"count\": %llu, \"mean\": %.3f, \"p50\": %.3f, \"p99\": %.3f, "
                "\"p99.9\": %.3f, \"max\": %.3f}",
                static_cast<unsigned long long>(p.count), p.mean_ms, p.p50_ms, p.p99_ms, p.p999_ms,
                p.max_ms);
  out += buf;
}

std::string quoted(std::string_view s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) q += c;
  }
  return q + "\"";
}

template <typename Map, typename Fn>
void append_map(std::string& out, const Map& m, Fn&& value) {
  out += "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) out += ", ";
    first = false;
    if constexpr (std::is_same_v<std::decay_t<decltype(k)>, std::string>) {
      out += quoted(k);
    } else {
      out += quoted(std::to_string(k));
    }
    out += ": ";
    value(out, v);
  }
  out += "}";
}

}  // namespace

Percentiles percentiles(std::vector<std::int64_t>& ns) {
  Percentiles p;
  p.count = ns.size();
  if (ns.empty()) return p;
  std::sort(ns.begin(), ns.end());
  // Nearest rank: the smallest value with at least q of the samples at or below it.
  auto at = [&](double q) {
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ns.size())));
    return static_cast<double>(ns[std::clamp<std::size_t>(rank, 1, ns.size()) - 1]) / 1e6;
  };
  double sum = 0;
  for (std::int64_t v : ns) sum += static_cast<double>(v);
  p.mean_ms = sum / static_cast<double>(ns.size()) / 1e6;
  p.p50_ms = at(0.50);
  p.p99_ms = at(0.99);
  p.p999_ms = at(0.999);
  p.max_ms = static_cast<double>(ns.back()) / 1e6;
  return p;
}

std::string per_second_line(std::size_t second, const Second& s) {
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "t=%zu scheduled=%llu sent=%llu late=%llu answered=%llu ok=%llu goodput=%llu "
      "rejected=%llu errors=%llu p50_ms=%.2f p99_ms=%.2f max_ms=%.2f conns=%u",
      second, static_cast<unsigned long long>(s.scheduled), static_cast<unsigned long long>(s.sent),
      static_cast<unsigned long long>(s.late), static_cast<unsigned long long>(s.answered),
      static_cast<unsigned long long>(s.ok), static_cast<unsigned long long>(s.goodput),
      static_cast<unsigned long long>(s.rejected), static_cast<unsigned long long>(s.errors),
      s.latency.p50_ms, s.latency.p99_ms, s.latency.max_ms, s.connections);
  return buf;
}

std::string summary_json(const Result& r, const Options& o) {
  std::string out = "{\n";
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "  \"seconds\": %.3f, \"target_rate\": %.2f, \"slo_ms\": %.3f, \"seed\": %llu,\n"
      "  \"scheduled\": %llu, \"sent\": %llu, \"late_sends\": %llu, "
      "\"achieved_rate\": %.2f, \"interarrival_mean_ms\": %.4f,\n"
      "  \"answered\": %llu, \"goodput\": %llu, \"goodput_per_s\": %.2f,\n"
      "  \"connections_opened\": %u, \"connections_max_open\": %u,\n",
      r.seconds, r.target_rate, static_cast<double>(o.slo_ns) / 1e6,
      static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(r.scheduled),
      static_cast<unsigned long long>(r.sent), static_cast<unsigned long long>(r.late),
      r.achieved_rate, r.interarrival_mean_ms, static_cast<unsigned long long>(r.answered),
      static_cast<unsigned long long>(r.goodput),
      r.seconds > 0 ? static_cast<double>(r.goodput) / r.seconds : 0.0, r.connections_opened,
      r.max_open);
  out += buf;
  auto count = [](std::string& s, std::uint64_t v) { s += std::to_string(v); };
  auto pct = [](std::string& s, const Percentiles& p) { append_percentiles(s, p); };
  out += "  \"status\": ";
  append_map(out, r.status, count);
  out += ",\n  \"rejections\": ";
  append_map(out, r.reasons, count);
  out += ",\n  \"errors\": ";
  append_map(out, r.errors, count);
  out += ",\n  \"send_lag_ms\": ";
  append_percentiles(out, r.send_lag);
  out += ",\n  \"latency_ms\": ";
  append_percentiles(out, r.latency);
  out += ",\n  \"latency_2xx_ms\": ";
  append_percentiles(out, r.latency_ok);
  out += ",\n  \"service_ms\": ";
  append_percentiles(out, r.service);
  out += ",\n  \"rejection_latency_ms\": ";
  append_percentiles(out, r.rejection);
  out += ",\n  \"rejection_latency_by_reason_ms\": ";
  append_map(out, r.rejection_by_reason, pct);
  out += ",\n  \"per_second\": [";
  for (std::size_t i = 0; i < r.per_second.size(); ++i) {
    const Second& s = r.per_second[i];
    std::snprintf(buf, sizeof buf,
                  "%s\n    {\"t\": %zu, \"scheduled\": %llu, \"sent\": %llu, \"late\": %llu, "
                  "\"answered\": %llu, \"ok\": %llu, \"goodput\": %llu, \"rejected\": %llu, "
                  "\"errors\": %llu, \"conns\": %u, \"p50_ms\": %.3f, \"p99_ms\": %.3f}",
                  i == 0 ? "" : ",", i, static_cast<unsigned long long>(s.scheduled),
                  static_cast<unsigned long long>(s.sent), static_cast<unsigned long long>(s.late),
                  static_cast<unsigned long long>(s.answered),
                  static_cast<unsigned long long>(s.ok), static_cast<unsigned long long>(s.goodput),
                  static_cast<unsigned long long>(s.rejected),
                  static_cast<unsigned long long>(s.errors), s.connections, s.latency.p50_ms,
                  s.latency.p99_ms);
    out += buf;
  }
  out += "\n  ]\n}\n";
  return out;
}

}  // namespace loadgen
