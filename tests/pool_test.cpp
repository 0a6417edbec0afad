#include <gtest/gtest.h>
#include <crew/pool.hpp>
TEST(Pool, Smoke) {
  crew::Pool pool;
  auto t = pool.submit([] { return 42; });
  EXPECT_EQ(t.get(), 42);
}
