// A coroutine job's spawn and its one delivery (service/jobs/job_spawn.hpp).
#include "jobs/job_spawn.hpp"

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <crew/asio_post_slot.hpp>
#include <optional>
#include <string>
#include <utility>

namespace crewd {
namespace {

using Io = boost::asio::io_context::executor_type;

// What a spawn shares with its frame and its queue deadline's timer. All
// but started() and frame_ended() run on `io_`'s thread.
class SpawnOp : public std::enable_shared_from_this<SpawnOp> {
 public:
  SpawnOp(Io io, JobDone done, std::shared_ptr<crew::Task<void>> handle, std::string name)
      : io_(io),
        end_slot_(io.context()),
        done_(std::move(done)),
        handle_(std::move(handle)),
        name_(std::move(name)) {}
  SpawnOp(const SpawnOp&) = delete;
  SpawnOp& operator=(const SpawnOp&) = delete;

  void arm_queue_deadline(std::chrono::nanoseconds after) {
    expiry_.emplace(io_, std::chrono::duration_cast<std::chrono::steady_clock::duration>(after));
    expiry_->async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->expire();
    });
  }

  // The task's first step (a worker of the pool).
  void started() noexcept { started_.store(true, std::memory_order_relaxed); }

  // The frame is being destroyed (any thread, once): the outcome follows at
  // once. Through a slot reserved at the spawn, so that a worker does not
  // take the io_context's lock (crew/asio_post_slot.hpp).
  void frame_ended() noexcept {
    try {
      end_slot_.post([self = shared_from_this()] { self->end(); });
    } catch (...) {  // out of memory: the request is left to the stop's deadlines
    }
  }

 private:
  void end() {
    if (!handle_->ready()) {
      // Published right after the frame is gone, by the thread that
      // destroyed it: looked at again after a short sleep (OutcomeBackoff).
      retry_end();
      return;
    }
    std::exception_ptr e;
    if (handle_->status() != crew::TaskStatus::succeeded) {
      try {
        handle_->get();
      } catch (...) {
        e = std::current_exception();
      }
    }
    deliver(std::move(e));
  }

  // end() again after the backoff's next wait.
  void retry_end() {
    if (!end_retry_) end_retry_.emplace(io_);
    end_retry_->expires_after(end_backoff_.next());
    end_retry_->async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->end();
    });
  }

  void expire() {
    if (claimed_ || started_.load(std::memory_order_relaxed)) return;
    // Queued still: its start, when a worker takes it, ends it unrun.
    (void)handle_->cancel();
    deliver(std::make_exception_ptr(
        crew::Error(crew::Errc::expired,
                    "task '" + name_ + "': " + std::string(crew::to_string(crew::Errc::expired)))));
  }

  void deliver(std::exception_ptr e) {
    if (std::exchange(claimed_, true)) return;
    if (expiry_) expiry_->cancel();
    JobDone done = std::move(done_);
    done(std::move(e));
  }

  Io io_;
  // frame_ended()'s post, reserved on io_'s thread. Until its end() runs
  // the slot keeps io_ busy (outstanding work); after it, end_retry_'s wait.
  crew::asio::PostSlot end_slot_;
  JobDone done_;
  std::shared_ptr<crew::Task<void>> handle_;
  std::string name_;
  std::optional<boost::asio::steady_timer> expiry_;
  std::optional<boost::asio::steady_timer> end_retry_;  // end() before the outcome was out
  OutcomeBackoff end_backoff_;
  std::atomic<bool> started_{false};
  bool claimed_ = false;
};

// Owned by the job's frame: its destruction is the task's end.
class FrameEnd {
 public:
  explicit FrameEnd(std::shared_ptr<SpawnOp> op) noexcept : op_(std::move(op)) {}
  FrameEnd(FrameEnd&&) noexcept = default;
  FrameEnd& operator=(FrameEnd&&) = delete;
  FrameEnd(const FrameEnd&) = delete;
  FrameEnd& operator=(const FrameEnd&) = delete;
  ~FrameEnd() {
    if (op_) op_->frame_ended();
  }
  [[nodiscard]] SpawnOp& op() const noexcept { return *op_; }

 private:
  std::shared_ptr<SpawnOp> op_;
};

crew::Co<void> framed(crew::Co<void> body, FrameEnd end) {
  end.op().started();
  co_await std::move(body);
}

}  // namespace

void async_try_spawn(crew::Pool& pool, Io io, crew::Co<void> body, crew::TaskOptions opts,
                     JobDone done, const std::shared_ptr<crew::Task<void>>& handle) {
  pool.check_options(opts);
  const auto queue_timeout = opts.queue_timeout;
  auto op = std::make_shared<SpawnOp>(io, std::move(done), handle, opts.name);
  *handle = crew::try_spawn(pool, framed(std::move(body), FrameEnd(op)), std::move(opts));
  const bool refused = handle->ready() && handle->status() == crew::TaskStatus::rejected &&
                       handle->reason() == crew::Errc::rejected;
  if (queue_timeout.count() > 0 && !refused) op->arm_queue_deadline(queue_timeout);
}

}  // namespace crewd
