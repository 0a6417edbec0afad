// The stopper thread and the stop requests it fires (stopper.hpp).
#include "stopper.hpp"

namespace crew::detail {

void StopTarget::fire() noexcept {
  if (task != nullptr) {
    task->request_stop(reason);
    task->release();
    task = nullptr;
  } else if (source.stop_possible()) {
    source.request_stop();
  }
}

void Stopper::hand(std::vector<StopTarget>& targets) noexcept {
  if (targets.empty()) return;
  {
    MutexLock lock(mu_);
    try {
      if (!thread_.joinable() && !exit_) thread_ = std::thread([this] { loop(); });
      if (thread_.joinable() && !exit_) {
        stops_.reserve(stops_.size() + targets.size());
        for (StopTarget& t : targets) stops_.push_back(std::move(t));
        targets.clear();
      }
    } catch (...) {  // no thread or no memory: fire them here
    }
  }
  ready_.notify_one();
  for (StopTarget& t : targets) t.fire();
  targets.clear();
}

// Fires what was handed, until stop() asks it to exit (it fires what is
// left first).
void Stopper::loop() noexcept {
  std::vector<StopTarget> batch;
  for (;;) {
    bool exit = false;
    {
      MutexLock lock(mu_);
      while (stops_.empty() && !exit_) ready_.wait(lock.native());
      batch.swap(stops_);
      exit = exit_;
    }
    for (StopTarget& t : batch) t.fire();  // user stop callbacks, outside the lock
    batch.clear();
    if (exit) {
      MutexLock lock(mu_);
      if (stops_.empty()) return;
    }
  }
}

void Stopper::stop() noexcept {
  {
    MutexLock lock(mu_);
    exit_ = true;
  }
  ready_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace crew::detail
