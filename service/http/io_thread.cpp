// One I/O thread's connections: adopting a new one (or refusing it at the
// connection limit), the sweep that fires their deadlines and frees idle
// buffers, the cut and the stop (service/http/io_thread.hpp). Runs on the
// thread itself.
#include "http/io_thread.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>

#include "http/connection.hpp"
#include "http/server_state.hpp"

namespace crewd::http {

void IoThread::link(Connection* c) noexcept {
  c->next_ = first;
  c->prev_ = nullptr;
  if (first != nullptr) first->prev_ = c;
  first = c;
  c->linked_ = true;
  ++count;
}

void IoThread::unlink(Connection* c) noexcept {
  if (c->prev_ != nullptr) c->prev_->next_ = c->next_;
  if (c->next_ != nullptr) c->next_->prev_ = c->prev_;
  if (first == c) first = c->next_;
  c->prev_ = c->next_ = nullptr;
  c->linked_ = false;
  --count;
}

// `over`: the connection took a slot past http.max_connections (State::open
// counts it already): the oldest idle connection of this thread gives its
// slot up, or the new one is refused.
void IoThread::adopt(tcp::socket socket, bool counted, bool over) {
  const bool refuse = over && !evict_one();
  auto c = std::make_shared<Connection>(*this, std::move(socket), counted);
  link(c.get());
  arm_sweep();  // it may have stopped: stopping, with no connection left
  if (refuse) {
    c->refuse();
    return;
  }
  c->start();
}

// The oldest idle connection of this thread makes room for a new one (one
// whose request is arriving this instant is passed over).
bool IoThread::evict_one() {
  Connection* skip[3] = {nullptr, nullptr, nullptr};
  for (Connection*& passed : skip) {
    Connection* oldest = nullptr;
    for (Connection* c = first; c != nullptr; c = c->next()) {
      if (!c->idle() || std::find(std::begin(skip), std::end(skip), c) != std::end(skip)) continue;
      if (oldest == nullptr || c->idle_since() < oldest->idle_since()) oldest = c;
    }
    if (oldest == nullptr) return false;
    if (oldest->quiet()) {
      oldest->evict();
      return true;
    }
    passed = oldest;
  }
  return false;
}

void IoThread::note_linger_cut() {
  ++linger_cuts;
  const auto now = Clock::now();
  if (now - last_linger_warning < std::chrono::seconds(10)) return;
  last_linger_warning = now;
  state.log->warn(
      "closed {} connections without lingering since the last warning: {} closes linger "
      "already, the most the descriptor limit leaves beside http.max_connections {}",
      linger_cuts, state.max_lingering, state.max_connections);
  linger_cuts = 0;
}

void IoThread::arm_sweep() {
  if (sweeping) return;
  sweeping = true;
  sweep_timer.expires_after(kSweepInterval);
  sweep_timer.async_wait([this](const error_code& ec) {
    sweeping = false;
    if (!ec) sweep();
  });
}

void IoThread::sweep() {
  const auto now = Clock::now();
  if (stopping && now >= force_close_at && !forced) {
    forced = true;
    std::size_t cut = 0;
    for (Connection* c = first; c != nullptr;) {
      Connection* next = c->next();  // c unlinks itself
      c->force_close();
      ++cut;
      c = next;
    }
    if (cut > 0) state.log->warn("stop deadline: closed {} connections still open", cut);
  }
  for (Connection* c = first; c != nullptr;) {
    Connection* next = c->next();  // c may unlink itself
    if (c->deadline() <= now) {
      c->on_deadline(now);
    } else {
      c->trim();
    }
    c = next;
  }
  // Stopping with no connection left: no more sweeps, so that run()
  // returns once the last task's completion has run.
  if (stopping && count == 0) return;
  arm_sweep();
}

void IoThread::cut() {
  for (Connection* c = first; c != nullptr;) {
    Connection* next = c->next();
    c->on_cut();
    c = next;
  }
}

void IoThread::begin_stop(Clock::time_point force_at) {
  stopping = true;
  force_close_at = force_at;
  if (accepts_over) work.reset();
  for (Connection* c = first; c != nullptr;) {
    Connection* next = c->next();
    c->on_stop();
    c = next;
  }
}

void IoThread::end_accepts() {
  accepts_over = true;
  if (stopping) work.reset();
}

}  // namespace crewd::http
