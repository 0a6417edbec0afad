// src/base/thread_name.hpp (private): the names of crew's threads,
// "<owner>-<role>" (a pool's workers "jobs-3", the application's
// "app-signals", "app-keeper"), so that they read in top and gdb.
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace crew::detail {

// Names the calling thread "<owner>-<role>", cut to the 15 bytes Linux
// keeps: the owner's name is shortened first, so that the role (a worker's
// id) stays whole while it fits.
inline void name_thread(std::string_view owner, std::string_view role) noexcept {
  constexpr std::size_t kMax = 15;
  std::string suffix = "-" + std::string(role);
  if (suffix.size() > kMax) suffix.resize(kMax);
  std::string name(owner.substr(0, kMax - suffix.size()));
  name += suffix;
  (void)pthread_setname_np(pthread_self(), name.c_str());
}

}  // namespace crew::detail
