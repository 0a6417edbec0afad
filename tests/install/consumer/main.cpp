// Uses crew through its installed headers and package config.
#include <crew/pool.hpp>

#include <cstdio>

int main() {
  crew::Pool pool;
  auto task = pool.submit([] { return 42; });
  const int value = task.get();
  if (value != 42) {
    std::fprintf(stderr, "consumer: expected 42, got %d\n", value);
    return 1;
  }
  std::puts("consumer: ok");
  return 0;
}
