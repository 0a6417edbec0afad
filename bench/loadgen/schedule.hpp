// bench/loadgen/schedule.hpp: when an open-loop load generator sends.
//
// The send times of a whole run are drawn before it starts, so that what
// the server does cannot move them: a slow answer delays nothing but its
// own request (no coordinated omission). Arrivals are Poisson within each
// phase: exponential gaps of mean 1/rate.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace loadgen {

// A stretch of the run at one mean rate, sending one of the request bodies.
struct Phase {
  double rate = 0;         // requests per second; 0: silence
  double seconds = 0;      // length of the phase
  std::uint32_t body = 0;  // index into the run's bodies
};

struct Send {
  std::int64_t at_ns = 0;  // from the start of the run
  std::uint32_t body = 0;
};

// The sends of `phases` one after the other, in time order; a given seed
// gives the same schedule.
[[nodiscard]] std::vector<Send> poisson_schedule(std::span<const Phase> phases, std::uint64_t seed);

// "RATE:SECONDS" or "RATE:SECONDS:BODY"; a message naming the bad part if
// it is not one.
[[nodiscard]] std::variant<Phase, std::string> parse_phase(const std::string& text);

[[nodiscard]] double total_seconds(std::span<const Phase> phases);

}  // namespace loadgen
