// bench/idle_pool.cpp: what destroying an idle pool costs, with the default
// shutdown (a drain bounded by 10 s) against the unbounded drain
// (shutdown_timeout 0, the default before).
//
//   crew_idle_pool [ROUNDS] [PER_ROUND]
//
// Each round destroys PER_ROUND pools of each variant, alternating variant
// by variant, in two shapes: `crew::Pool pool;` never used (no worker
// started), and one that ran a task and is idle (its workers parked). It
// prints each round's medians and the median of the rounds, in
// microseconds, and the ratio default / unbounded.
#include <algorithm>
#include <chrono>
#include <crew/pool.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Microseconds the destructor of one idle pool took.
double destroy_us(const crew::PoolOptions& options, bool used) {
  auto pool = std::make_unique<crew::Pool>(options);
  if (used) {
    (void)pool->post([] {});
    (void)pool->wait_idle(std::chrono::seconds(10));
  }
  const auto t0 = Clock::now();
  pool.reset();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int per_round = argc > 2 ? std::atoi(argv[2]) : 100;
  const crew::PoolOptions bounded{};  // the default
  crew::PoolOptions unbounded{};
  unbounded.shutdown_timeout = std::chrono::nanoseconds{0};
  for (const bool used : {false, true}) {
    std::vector<double> med_bounded;
    std::vector<double> med_unbounded;
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> b;
      std::vector<double> u;
      for (int i = 0; i < per_round; ++i) {
        b.push_back(destroy_us(bounded, used));
        u.push_back(destroy_us(unbounded, used));
      }
      med_bounded.push_back(median(b));
      med_unbounded.push_back(median(u));
      std::printf("%s round %d: default %.1f us, unbounded %.1f us\n", used ? "used" : "unused",
                  r + 1, med_bounded.back(), med_unbounded.back());
    }
    const double mb = median(med_bounded);
    const double mu = median(med_unbounded);
    std::printf(
        "%s pool, destructor: default (drain, 10 s) %.1f us, unbounded drain %.1f us, "
        "ratio %.2f\n",
        used ? "used" : "unused", mb, mu, mu > 0 ? mb / mu : 0);
  }
  return 0;
}
