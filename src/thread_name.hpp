// src/thread_name.hpp (private): the names of the application's threads,
// "<application name>-<role>" ("app-signals", "app-keeper", "app-init"),
// cut to the 15 bytes Linux keeps, so that they read in top and gdb.
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace crew::detail {

// Names the calling thread.
inline void name_thread(const std::string& app, std::string_view role) noexcept {
  std::string name = app + "-" + std::string(role);
  if (name.size() > 15) name.resize(15);
  (void)pthread_setname_np(pthread_self(), name.c_str());
}

}  // namespace crew::detail
