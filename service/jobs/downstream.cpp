// A call job's GET (service/jobs/downstream.hpp): Beast over a TCP stream
// on an I/O thread's executor, awaited through crew::on_callback.
#include "jobs/downstream.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <memory>
#include <optional>
#include <stop_token>
#include <utility>

namespace crewd {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::asio::ip::tcp;

// Not an anonymous namespace: call_downstream's coroutine frame, a type
// g++ gives the function's (external) linkage, holds these types, and g++
// warns (-Wsubobject-linkage) when such a type's fields have internal
// linkage or none (a lambda's); hence also the named function objects
// below instead of lambdas.
namespace downstream_call {

// What the I/O side hands back to the coroutine.
struct CallResult {
  beast::error_code ec;
  unsigned status = 0;
  std::size_t body_bytes = 0;
};

// One GET. Shared by the coroutine (until its co_await ends) and the
// handlers of its I/O (until the last one has run): whoever holds it last
// destroys it. Everything but start() and cancel() runs on the stream's
// executor.
class CallOp : public std::enable_shared_from_this<CallOp> {
 public:
  CallOp(boost::asio::any_io_executor io, const Downstream& to, std::chrono::milliseconds timeout)
      : stream_(std::move(io)), to_(to), timeout_(timeout) {}
  CallOp(const CallOp&) = delete;
  CallOp& operator=(const CallOp&) = delete;

  // On the task's worker, inside the co_await: the resume is stored before
  // the post, which hands it to the I/O thread.
  void start(crew::Resume<CallResult> resume) {
    resume_.emplace(std::move(resume));
    boost::asio::post(stream_.get_executor(), [self = shared_from_this()] { self->connect(); });
  }

  // From the task's stop callback (any thread).
  void cancel() {
    boost::asio::post(stream_.get_executor(), [self = shared_from_this()] {
      self->cancelled_ = true;
      self->stream_.cancel();
    });
  }

 private:
  void connect() {
    if (cancelled_) {
      finish(boost::asio::error::operation_aborted);
      return;
    }
    stream_.expires_after(timeout_);
    stream_.async_connect(to_.endpoints,
                          [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                            if (ec) {
                              self->finish(ec);
                            } else {
                              self->write();
                            }
                          });
  }

  void write() {
    req_ = bhttp::request<bhttp::empty_body>(bhttp::verb::get, to_.target, 11);
    req_.set(bhttp::field::host, to_.host);
    req_.set(bhttp::field::user_agent, "crewd");
    req_.set(bhttp::field::connection, "close");
    bhttp::async_write(stream_, req_,
                       [self = shared_from_this()](beast::error_code ec, std::size_t) {
                         if (ec) {
                           self->finish(ec);
                         } else {
                           self->read();
                         }
                       });
  }

  void read() {
    parser_.body_limit(kMaxBody);
    bhttp::async_read(stream_, buffer_, parser_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec) {
                          self->finish(ec);
                        } else {
                          const auto& res = self->parser_.get();
                          self->finish({}, res.result_int(), res.body().size());
                        }
                      });
  }

  void finish(beast::error_code ec, unsigned status = 0, std::size_t bytes = 0) {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    if (resume_) {
      crew::Resume<CallResult> resume = std::move(*resume_);
      resume_.reset();
      resume(CallResult{ec, status, bytes});  // resumes the coroutine on its pool
    }
  }

  static constexpr std::uint64_t kMaxBody = 1 << 20;  // a larger answer is an error

  beast::tcp_stream stream_;
  const Downstream& to_;  // crewd's, outlives every job
  const std::chrono::milliseconds timeout_;
  std::optional<crew::Resume<CallResult>> resume_;
  bool cancelled_ = false;
  bhttp::request<bhttp::empty_body> req_;
  beast::flat_buffer buffer_;
  bhttp::response_parser<bhttp::string_body> parser_;
};

// The task's stop callback: ends the request, on its I/O thread.
struct CancelOnStop {
  std::shared_ptr<CallOp> op;
  void operator()() const { op->cancel(); }
};

// on_callback's start: hands the request to its I/O thread.
struct StartCall {
  std::shared_ptr<CallOp> op;
  void operator()(crew::Resume<CallResult> resume) const { op->start(std::move(resume)); }
};

}  // namespace downstream_call

using downstream_call::CallOp;
using downstream_call::CallResult;

Downstream resolve_downstream(const HttpUrl& url, std::string text) {
  boost::asio::io_context io;
  tcp::resolver resolver(io);
  beast::error_code ec;
  const auto found = resolver.resolve(url.host, std::to_string(url.port), ec);
  if (ec) throw std::runtime_error("cannot resolve " + url.host + ": " + ec.message());
  Downstream d;
  for (const auto& entry : found) d.endpoints.push_back(entry.endpoint());
  d.host = url.port == 80 ? url.host : url.host + ":" + std::to_string(url.port);
  d.target = url.target;
  d.url = std::move(text);
  return d;
}

crew::Co<DownstreamAnswer> call_downstream(boost::asio::any_io_executor io, const Downstream& to,
                                           std::chrono::milliseconds timeout) {
  auto op = std::make_shared<CallOp>(std::move(io), to, timeout);
  // A stop of the task ends the co_await below at once; this also ends the
  // request, on its I/O thread.
  const std::stop_callback on_stop(crew::current_stop_token(), downstream_call::CancelOnStop{op});
  // Named first: g++ 12 may destroy a temporary made inside a co_await
  // expression twice (docs/coroutines.md, "Traps").
  const downstream_call::StartCall start{op};
  const CallResult r = co_await crew::on_callback<CallResult>(start);
  if (r.ec == beast::error::timeout) {
    throw DownstreamError(
        "GET " + to.url + ": no answer within " + std::to_string(timeout.count()) + " ms", true);
  }
  if (r.ec) throw DownstreamError("GET " + to.url + ": " + r.ec.message(), false);
  co_return DownstreamAnswer{.status = r.status, .body_bytes = r.body_bytes};
}

}  // namespace crewd
