// service/tests/slow_downstream.hpp: an HTTP server on a free loopback port
// that answers every request `status` after `delay`, on one thread of its
// own (Asio): what crewd's call jobs GET in the tests.
//
// Threads: its thread runs every handler; requests() and the destructor may
// be called from any thread. The destructor stops the thread and closes
// every connection (bounded: nothing it waits on blocks).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace crewd::test {

class SlowDownstream {
 public:
  SlowDownstream(std::chrono::milliseconds delay, int status = 200)
      : delay_(delay), status_(status) {
    acceptor_.open(tcp::v4());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind({boost::asio::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen(4096);
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  SlowDownstream(const SlowDownstream&) = delete;
  SlowDownstream& operator=(const SlowDownstream&) = delete;
  ~SlowDownstream() {
    io_.stop();
    thread_.join();
  }

  [[nodiscard]] int port() const { return acceptor_.local_endpoint().port(); }
  [[nodiscard]] std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port()) + "/slow";
  }
  // Requests read in full so far.
  [[nodiscard]] int requests() const { return requests_.load(); }

 private:
  using tcp = boost::asio::ip::tcp;
  struct Exchange {
    explicit Exchange(tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
    tcp::socket socket;
    boost::asio::steady_timer timer;
    boost::asio::streambuf in;
    std::string out;
  };

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;
      serve(std::make_shared<Exchange>(std::move(s)));
      accept();
    });
  }

  void serve(const std::shared_ptr<Exchange>& x) {
    boost::asio::async_read_until(
        x->socket, x->in, "\r\n\r\n", [this, x](boost::system::error_code ec, std::size_t) {
          if (ec) return;
          requests_.fetch_add(1);
          x->timer.expires_after(delay_);
          x->timer.async_wait([this, x](boost::system::error_code) {
            x->out = "HTTP/1.1 " + std::to_string(status_) +
                     " Status\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
            boost::asio::async_write(x->socket, boost::asio::buffer(x->out),
                                     [x](boost::system::error_code, std::size_t) {
                                       boost::system::error_code ignored;
                                       x->socket.shutdown(tcp::socket::shutdown_send, ignored);
                                     });
          });
        });
  }

  const std::chrono::milliseconds delay_;
  const int status_;
  std::atomic<int> requests_{0};
  boost::asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  std::thread thread_;
};

}  // namespace crewd::test
