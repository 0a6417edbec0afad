// src/base/os_thread.hpp (private): a joinable thread with a chosen stack size,
// for the pool's workers (std::thread cannot set one).
#pragma once

#include <pthread.h>

#include <cerrno>
#include <cstddef>
#include <memory>
#include <system_error>
#include <utility>

namespace crew::detail {

class OsThread {
 public:
  OsThread() noexcept = default;
  // Starts f() on a new thread with `stack_size` bytes of stack (0: the
  // system default). Throws std::system_error if the thread cannot start.
  template <class F>
  OsThread(std::size_t stack_size, F&& f) {
    using Fn = std::decay_t<F>;
    auto fn = std::make_unique<Fn>(std::forward<F>(f));
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) throw std::system_error(ENOMEM, std::generic_category());
    int rc = stack_size == 0 ? 0 : pthread_attr_setstacksize(&attr, stack_size);
    if (rc == 0) rc = pthread_create(&id_, &attr, &trampoline<Fn>, fn.get());
    pthread_attr_destroy(&attr);
    if (rc != 0) throw std::system_error(rc, std::generic_category(), "pthread_create");
    (void)fn.release();  // the thread owns it now
    joinable_ = true;
  }
  OsThread(OsThread&& o) noexcept : id_(o.id_), joinable_(std::exchange(o.joinable_, false)) {}
  OsThread& operator=(OsThread&& o) noexcept {
    if (this != &o) {
      if (joinable_) std::terminate();  // as std::thread: never drop a running thread
      id_ = o.id_;
      joinable_ = std::exchange(o.joinable_, false);
    }
    return *this;
  }
  OsThread(const OsThread&) = delete;
  OsThread& operator=(const OsThread&) = delete;
  ~OsThread() {
    if (joinable_) std::terminate();
  }

  [[nodiscard]] bool joinable() const noexcept { return joinable_; }
  void join() noexcept {
    (void)pthread_join(id_, nullptr);
    joinable_ = false;
  }
  void detach() noexcept {
    (void)pthread_detach(id_);
    joinable_ = false;
  }

 private:
  template <class Fn>
  static void* trampoline(void* arg) {
    std::unique_ptr<Fn> fn(static_cast<Fn*>(arg));
    (*fn)();
    return nullptr;
  }

  pthread_t id_{};
  bool joinable_ = false;
};

}  // namespace crew::detail
