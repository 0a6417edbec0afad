#include "schedule.hpp"

#include <cmath>
#include <cstdlib>
#include <random>

namespace loadgen {

std::vector<Send> poisson_schedule(std::span<const Phase> phases, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Send> sends;
  double phase_start = 0;
  for (const Phase& p : phases) {
    const double end = phase_start + p.seconds;
    if (p.rate > 0) {
      sends.reserve(sends.size() + static_cast<std::size_t>(p.rate * p.seconds * 1.1) + 16);
      std::exponential_distribution<double> gap(p.rate);
      // Memoryless: starting the phase's first gap at the phase's start
      // leaves the process Poisson across the boundary.
      for (double t = phase_start + gap(rng); t < end; t += gap(rng)) {
        sends.push_back({.at_ns = std::llround(t * 1e9), .body = p.body});
      }
    }
    phase_start = end;
  }
  return sends;
}

std::variant<Phase, std::string> parse_phase(const std::string& text) {
  Phase p;
  const char* s = text.c_str();
  char* end = nullptr;
  p.rate = std::strtod(s, &end);
  if (end == s || *end != ':' || !(p.rate >= 0) || !std::isfinite(p.rate)) {
    return "phase '" + text + "': RATE must be a number >= 0 (RATE:SECONDS[:BODY])";
  }
  s = end + 1;
  p.seconds = std::strtod(s, &end);
  if (end == s || !(p.seconds > 0) || !std::isfinite(p.seconds) || (*end != '\0' && *end != ':')) {
    return "phase '" + text + "': SECONDS must be a number > 0 (RATE:SECONDS[:BODY])";
  }
  if (*end == ':') {
    s = end + 1;
    const unsigned long body = std::strtoul(s, &end, 10);
    if (end == s || *end != '\0' || body > 1000) {
      return "phase '" + text + "': BODY must be the index of a --body (RATE:SECONDS[:BODY])";
    }
    p.body = static_cast<std::uint32_t>(body);
  }
  return p;
}

double total_seconds(std::span<const Phase> phases) {
  double s = 0;
  for (const Phase& p : phases) s += p.seconds;
  return s;
}

}  // namespace loadgen
