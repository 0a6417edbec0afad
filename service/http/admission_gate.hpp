// service/http/admission_gate.hpp: which requests still start work while crewd
// stops (server.hpp, "Stopping"): the cut, the first request of each
// connection accepted before it, and the admitted requests whose response
// is not yet written.
//
// Threads: halt() and cut() run on main's thread (the stop sequence);
// on_accept() on the accepting I/O thread (I/O thread 0); the other on_*
// calls on the I/O thread of the connection they are about, with that
// connection's own flags (`counted`, `admitted_open`), which only that
// thread touches. The counts are read by main's thread while it waits
// (HttpServer::wait_first_requests, wait_admitted); halting() by every
// I/O thread (/readyz, Connection: close).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace crewd::http {

// Which requests still start work while crewd stops. The counters are
// sequentially consistent so that the cut (main's thread) and an admission
// (an I/O thread) cannot miss each other: each side writes its own
// variable, then reads the other's. The per-connection flags are touched
// only by the connection's I/O thread.
class Gate {
 public:
  // Whether the connection is counted until its first request.
  bool on_accept() noexcept {
    first_pending_.fetch_add(1);
    if (cut_.load()) {
      first_pending_.fetch_sub(1);
      return false;
    }
    return true;
  }

  // A request's head arrived; `work` says whether it would start work.
  // Returns whether it may. The first request of a connection accepted
  // before the cut is always admitted: the client sent it before it could
  // know. An admitted request counts as being handed over (see
  // begin_handover) before the first request is uncounted, so that the
  // stop, which reads first_pending() and then handing_over(), cannot see
  // neither.
  bool on_request(bool& counted, bool& admitted_open, bool& handing_over, bool work) noexcept {
    const bool first = counted;
    if (work) {
      admitted_open_.fetch_add(1);  // before the first is uncounted
      begin_handover(handing_over);
    }
    if (first) {
      counted = false;
      first_pending_.fetch_sub(1);
    }
    if (!work) return true;
    if (!first && cut_.load()) {
      end_handover(handing_over);
      admitted_open_.fetch_sub(1);
      return false;
    }
    admitted_open = true;
    return true;
  }

  // An admitted request not yet handed to its pool (`handing_over`: the
  // connection's flag): its body may still be arriving, or its task not yet
  // submitted. on_request begins it; the submission, a response or the
  // connection's close ends it. The stop waits for none to be left before
  // it stops the pools, which then still take every admitted task.
  void begin_handover(bool& handing_over) noexcept {
    if (handing_over) return;
    handing_over = true;
    handing_over_.fetch_add(1);
  }
  void end_handover(bool& handing_over) noexcept {
    if (!handing_over) return;
    handing_over = false;
    handing_over_.fetch_sub(1);
  }

  void on_response_done(bool& admitted_open) noexcept {
    if (admitted_open) {
      admitted_open = false;
      admitted_open_.fetch_sub(1);
    }
  }

  void on_close(bool& counted, bool& admitted_open, bool& handing_over) noexcept {
    if (counted) {
      counted = false;
      first_pending_.fetch_sub(1);
    }
    end_handover(handing_over);
    on_response_done(admitted_open);
  }

  void halt() noexcept { halting_.store(true); }
  // `receive_by`: what a request still arriving after the cut must have sent
  // by (steady clock, ns), so that the pools can still run its task within
  // the termination timeout.
  void cut(std::int64_t receive_by_ns) noexcept {
    receive_by_ns_.store(receive_by_ns);
    cut_.store(true);
  }
  [[nodiscard]] bool halting() const noexcept { return halting_.load(std::memory_order_relaxed); }
  [[nodiscard]] bool is_cut() const noexcept { return cut_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t first_pending() const noexcept { return first_pending_.load(); }
  [[nodiscard]] std::size_t admitted_open() const noexcept { return admitted_open_.load(); }
  [[nodiscard]] std::size_t handing_over() const noexcept { return handing_over_.load(); }
  // Meaningful once is_cut().
  [[nodiscard]] std::int64_t receive_by_ns() const noexcept { return receive_by_ns_.load(); }
  [[nodiscard]] std::chrono::steady_clock::time_point receive_by() const noexcept {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(receive_by_ns()));
  }
  // `t`, or receive_by after the cut if that comes first: a request still
  // arriving then must be complete by receive_by, so that the pools can run
  // its task within the termination timeout (no client holds the stop past
  // its deadlines).
  [[nodiscard]] std::chrono::steady_clock::time_point receive_deadline(
      std::chrono::steady_clock::time_point t) const noexcept {
    return is_cut() ? std::min(t, receive_by()) : t;
  }

 private:
  std::atomic<bool> halting_{false};
  std::atomic<bool> cut_{false};
  std::atomic<std::size_t> first_pending_{0};
  std::atomic<std::size_t> admitted_open_{0};
  std::atomic<std::size_t> handing_over_{0};
  std::atomic<std::int64_t> receive_by_ns_{0};
};

}  // namespace crewd::http
