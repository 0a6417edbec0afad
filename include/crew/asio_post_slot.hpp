// crew/asio_post_slot.hpp: a post to an io_context reserved on one thread
// and made later from another, typically a pool worker handing a task's end
// back to an I/O thread, without taking the io_context's lock:
//
//   // on the I/O thread, when the work is handed out
//   crew::asio::PostSlot slot(io);
//   pool.post([slot = std::move(slot)]() mutable {
//     ...;
//     slot.post([] { /* on an I/O thread of io */ });
//   });
//
// Why not boost::asio::post: Asio's io_context takes one mutex per post
// from a thread that is not running it, and wakes a sleeping I/O thread
// while it still holds that mutex. When workers outnumber the CPUs (crewd's
// jobs pool: 64 workers on 2 CPUs), the woken I/O thread often preempts the
// worker inside that section and then blocks on the mutex, and the worker,
// back in the run queue behind the other busy workers, releases it a time
// slice later: the I/O thread, and every request on it, stalls for
// milliseconds. A PostSlot's post takes no lock: it pushes onto a lock-free
// list and writes an eventfd the io_context waits on.
//
// Semantics, as boost::asio::post(io.get_executor(), f):
//   - f runs once, on a thread running io (run(), poll(), ...), never inside
//     post();
//   - from the slot's construction until f has run (or the slot was
//     destroyed unposted), io has outstanding work: run() does not return;
//   - if io is destroyed first, f is destroyed without running, as Asio
//     destroys the handlers it still holds.
// A PostSlot is move-only; post() may be called once (a second call, or a
// call on a moved-from slot, throws std::logic_error). Destroying a slot
// unposted gives the reservation back. Any thread may post; the slot
// itself is not shared between threads without synchronisation.
// Handlers posted through slots run in the order their posts reached the
// list, as far as one eventfd wake-up batches them (Asio promises no order
// between posts from different threads either), one after another on the
// thread that took the wake-up: a handler that blocks holds back the ones
// behind it, even with other threads running io (post longer work on to
// the executor, as crew::asio's completions do). If f throws, the
// exception leaves io.run() as with Asio's own handlers; the handlers
// behind it run at the next call to run(). After fork(), parent and child
// share the eventfd: only one of them may go on using slots of io.
//
// Linux only (eventfd). Cost: the reservation is one atomic increment on
// the reserving thread (plus, when the io_context had no slot outstanding,
// one post to start the wait); post() is one allocation, one compare-and-
// swap and, when the list was empty, one write(2).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/system/system_error.hpp>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>

namespace crew::asio {

namespace detail {

// One handler in an Inbox's list.
struct InboxNode {
  virtual ~InboxNode() = default;
  virtual void run() = 0;
  InboxNode* next = nullptr;
};

template <class F>
struct InboxFn : InboxNode {
  explicit InboxFn(F&& fn) : f(std::move(fn)) {}
  void run() override { f(); }
  F f;
};

// An io_context's lock-free list of posted handlers, one per io_context
// (an Asio service). Threads:
//   - reserve(): any thread (counts a slot; starts the wait when none runs);
//   - push(), release(): any thread, no lock;
//   - start_wait(), on_ready(), the backlog: the io_context's threads, one
//     drain at a time (at most one wait is outstanding, and the next one
//     starts only when a drain ends).
// The wait on the eventfd is outstanding work of the io_context, so it is
// kept only while slots are outstanding (slots_ > 0): an idle io_context's
// run() still returns.
class Inbox final : public boost::asio::io_context::service {
 public:
  static inline boost::asio::io_context::id id;

  explicit Inbox(boost::asio::io_context& io)
      : boost::asio::io_context::service(io), io_(io), wake_(io, open_eventfd()) {}
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;
  ~Inbox() override { destroy_all(); }

  void reserve() {
    slots_.fetch_add(1);
    if (armed_.load() || armed_.exchange(true)) return;
    try {
      boost::asio::dispatch(io_.get_executor(), [this] { start_wait(); });
    } catch (...) {
      armed_.store(false);
      slots_.fetch_sub(1);
      throw;
    }
  }

  // Hands n (a reserved slot's handler) to the io_context; n's slot is
  // given back once it has run.
  void push(InboxNode* n) noexcept {
    InboxNode* head = list_.load(std::memory_order_relaxed);
    do {
      n->next = head;
    } while (!list_.compare_exchange_weak(head, n, std::memory_order_release,
                                          std::memory_order_relaxed));
    // A non-empty list has a wake-up owed already: its first pusher's, and
    // the drain that takes that node takes this one too.
    if (head == nullptr) wake();
  }

  // A slot destroyed unposted: the wait, if it was the last, must end, so
  // the drain is woken to see that.
  void release() noexcept {
    slots_.fetch_sub(1);
    wake();
  }

 private:
  static int open_eventfd() {
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
      throw boost::system::system_error(errno, boost::system::system_category(),
                                        "crew::asio::PostSlot: eventfd");
    }
    return fd;
  }

  void shutdown() override { destroy_all(); }

  void destroy_all() noexcept {
    delete_chain(backlog_);
    backlog_ = nullptr;
    delete_chain(list_.exchange(nullptr, std::memory_order_acquire));
  }

  static void delete_chain(InboxNode* n) noexcept {
    while (n != nullptr) delete std::exchange(n, n->next);
  }

  void wake() noexcept {
    const std::uint64_t one = 1;
    // Fails only if the counter would overflow (it is then readable anyway)
    // or the io_context is gone (a broken lifetime rule).
    (void)!::write(wake_.native_handle(), &one, sizeof one);
  }

  // On an io_context thread, with armed_ set and no wait outstanding.
  void start_wait() {
    wake_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                     [this](const boost::system::error_code& ec) {
                       if (!ec) on_ready();
                     });
  }

  void on_ready() {
    std::uint64_t count = 0;
    (void)!::read(wake_.native_handle(), &count, sizeof count);
    // Oldest first: the list is newest first, the backlog (left by a
    // handler that threw) older than anything in it.
    InboxNode* fresh = list_.exchange(nullptr, std::memory_order_acquire);
    InboxNode* oldest_first = nullptr;
    while (fresh != nullptr) {
      InboxNode* n = std::exchange(fresh, fresh->next);
      n->next = oldest_first;
      oldest_first = n;
    }
    InboxNode** tail = &backlog_;
    while (*tail != nullptr) tail = &(*tail)->next;
    *tail = oldest_first;

    std::size_t ran = 0;
    try {
      while (backlog_ != nullptr) {
        std::unique_ptr<InboxNode> n(std::exchange(backlog_, backlog_->next));
        ++ran;
        n->run();
      }
    } catch (...) {
      // The rest run at the next drain, woken at once.
      if (backlog_ != nullptr) wake();
      end_drain(ran);
      throw;
    }
    end_drain(ran);
  }

  // The `ran` handlers give their slots back; the wait goes on while any
  // slot is outstanding.
  void end_drain(std::size_t ran) {
    if (slots_.fetch_sub(ran) > ran) {
      start_wait();
      return;
    }
    armed_.store(false);
    // A slot reserved between the decrement and the store found armed_
    // set and left the wait to this drain.
    if (slots_.load() > 0 && !armed_.exchange(true)) start_wait();
  }

  boost::asio::io_context& io_;
  boost::asio::posix::stream_descriptor wake_;
  std::atomic<InboxNode*> list_{nullptr};
  InboxNode* backlog_ = nullptr;  // the drain's: left unrun when a handler threw
  std::atomic<std::size_t> slots_{0};
  std::atomic<bool> armed_{false};
};

}  // namespace detail

class PostSlot {
 public:
  // Reserves a post to io (any thread; io's threads included).
  explicit PostSlot(boost::asio::io_context& io)
      : inbox_(&boost::asio::use_service<detail::Inbox>(io)) {
    inbox_->reserve();
  }
  PostSlot(PostSlot&& other) noexcept : inbox_(std::exchange(other.inbox_, nullptr)) {}
  PostSlot& operator=(PostSlot&& other) noexcept {
    if (this != &other) {
      give_back();
      inbox_ = std::exchange(other.inbox_, nullptr);
    }
    return *this;
  }
  PostSlot(const PostSlot&) = delete;
  PostSlot& operator=(const PostSlot&) = delete;
  ~PostSlot() { give_back(); }

  // True until post() or a move from it.
  [[nodiscard]] bool reserved() const noexcept { return inbox_ != nullptr; }

  // For a post made by hand (crew::asio's completions, pushed once the
  // pool has published the task's outcome): the reservation, to be spent
  // by exactly one Inbox::push of a node made with new. The slot is no
  // longer reserved(); null if it was not.
  [[nodiscard]] detail::Inbox* take_reservation() noexcept {
    return std::exchange(inbox_, nullptr);
  }

  // Runs f on a thread running the io_context, later (never inside this
  // call). Any thread; takes no lock. Throws std::logic_error if the slot is
  // not reserved(), std::bad_alloc (the slot is then still reserved, and f
  // was not moved from).
  template <class F>
  void post(F&& f) {
    if (inbox_ == nullptr) throw std::logic_error("crew::asio::PostSlot: posted twice");
    using Fn = std::decay_t<F>;
    auto* node = new detail::InboxFn<Fn>(Fn(std::forward<F>(f)));
    std::exchange(inbox_, nullptr)->push(node);
  }

 private:
  void give_back() noexcept {
    if (inbox_ != nullptr) std::exchange(inbox_, nullptr)->release();
  }

  detail::Inbox* inbox_;
};

}  // namespace crew::asio
