// crewd's front door against hostile and careless clients: pipelining,
// header and body limits, Content-Length validation, Expect, Range, request
// deadlines, slow and idle connections that must not starve anyone, a slow
// reader (the connection limit: crewd_connection_limit_test.cpp). One crewd
// with small limits for the suite. Every wait is bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "crewd_harness.hpp"
#include "crewd_responses.hpp"
#include "crewd_suite.hpp"

namespace crewd::test {
namespace {

using Json = nlohmann::json;
using Outcome = Exchange::Outcome;

// Process state of crewd, from /proc.
std::size_t rss_bytes(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/statm").c_str(), "r");
  if (f == nullptr) return 0;
  unsigned long size = 0;
  unsigned long resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// One crewd with small limits for the suite.
class CrewdLimits : public SharedCrewd<CrewdLimits> {
 public:
  static std::vector<std::string> args() {
    return {"--listen",
            "127.0.0.1:0",
            "--http-header-limit",
            "4096",
            "--http-header-count-limit",
            "50",
            "--http-body-limit",
            "4096",
            "--http-head-timeout-ms",
            "800",
            "--http-body-timeout-ms",
            "800",
            "--http-keep-alive-timeout-s",
            "1",
            "--http-write-timeout-ms",
            "500",
            "--jobs-max-ms",
            "2000"};
  }
};

std::uint64_t jobs_submitted(int port) {
  const Json j = json_of(get(port, "/api/v1/pools"));
  return j["pools"][1]["submitted"].get<std::uint64_t>();
}

// ---- pipelining ----

TEST_F(CrewdLimits, FivePipelinedPostsGetFiveResponsesInOrderAndRunFiveJobs) {
  const std::uint64_t before = jobs_submitted(port_);
  std::string batch;
  // Spin jobs: one submission each (a sleep job, a coroutine task, adds
  // one for each resumption).
  for (int i = 0; i < 5; ++i) {
    const std::string body = R"({"kind":"spin","ms":)" + std::to_string(10 * (5 - i)) +
                             R"(,"name":"p)" + std::to_string(i) + "\"}";
    batch +=
        "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
  }
  Socket s = connect_to(port_);
  ASSERT_GE(s.fd(), 0);
  ASSERT_TRUE(send_all(s.fd(), batch));  // one write
  Responses in(s.fd());
  for (int i = 0; i < 5; ++i) {
    const Exchange ex = in.next();
    ASSERT_EQ(ex.outcome, Outcome::response) << "response " << i;
    EXPECT_EQ(ex.status, 200) << ex.body;
    EXPECT_EQ(json_of(ex)["name"], "p" + std::to_string(i)) << "in request order";
  }
  EXPECT_EQ(jobs_submitted(port_) - before, 5u);
}

TEST_F(CrewdLimits, PipelinedGetsAreAnsweredInOrder) {
  std::string batch;
  for (int n = 1; n <= 20; ++n) {
    batch += "GET /api/v1/factorial/" + std::to_string(n) + " HTTP/1.1\r\nHost: x\r\n\r\n";
  }
  batch += "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  Socket s = connect_to(port_);
  ASSERT_TRUE(send_all(s.fd(), batch));
  Responses in(s.fd());
  for (int n = 1; n <= 20; ++n) {
    const Exchange ex = in.next();
    ASSERT_EQ(ex.outcome, Outcome::response) << n;
    EXPECT_EQ(json_of(ex)["n"], n);
  }
  const Exchange last = in.next();
  EXPECT_EQ(last.status, 200);
  EXPECT_EQ(last.header("connection"), "close");
  EXPECT_TRUE(in.closed(2'000ms));
}

// A client that pipelines requests and then shuts its sending side gets
// every response, the last one with Connection: close. The requests after
// the job arrive while it runs, 8,704 bytes in all: exactly what the
// connection's first reads take (its 512-byte landing buffer, then an
// 8 KiB chunk), so that the read after them finds the end of the stream
// before the first of them is answered. Such a connection used to be closed
// after the response that followed the end of the stream, dropping the
// rest.
TEST_F(CrewdLimits, PipelinedRequestsBeforeAHalfCloseAreAllAnswered) {
  auto get_of_size = [](std::size_t size) {
    const std::string base = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n";
    return "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(size - base.size(), 'a') +
           "\r\n\r\n";
  };
  const std::string job = R"({"kind":"sleep","ms":200})";
  const std::string first =
      "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(job.size()) +
      "\r\n\r\n" + job;
  // Each under the fixture's 4,096-byte header limit.
  const std::string rest =
      get_of_size(300) + get_of_size(2800) + get_of_size(2800) + get_of_size(8704 - 5900);
  ASSERT_EQ(rest.size(), 8704u);
  for (int run = 0; run < 3; ++run) {
    Socket s = connect_to(port_);
    ASSERT_GE(s.fd(), 0);
    ASSERT_TRUE(send_all(s.fd(), first));
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(send_all(s.fd(), rest));
    ::shutdown(s.fd(), SHUT_WR);
    Responses in(s.fd());
    for (int i = 0; i < 5; ++i) {
      const Exchange ex = in.next();
      ASSERT_EQ(ex.outcome, Outcome::response) << "run " << run << ", response " << i;
      EXPECT_EQ(ex.status, 200) << ex.body;
      EXPECT_EQ(ex.header("connection"), i == 4 ? "close" : "") << "run " << run << ", " << i;
    }
    EXPECT_TRUE(in.closed(2'000ms));
  }
}

// ---- header limits ----

TEST_F(CrewdLimits, AHeaderSectionOverTheLimitIs431) {
  const std::string big = "X-Big: " + std::string(5000, 'a') + "\r\n";
  const Exchange ex = send_request(port_, request_text("GET", "/healthz", "", big), 5'000ms);
  ASSERT_EQ(ex.outcome, Outcome::response) << to_string(ex.outcome);
  EXPECT_EQ(ex.status, 431);
  EXPECT_NE(error_of(ex).find("http.header_limit (4096 bytes)"), std::string::npos) << ex.body;
  EXPECT_EQ(ex.header("connection"), "close");
}

TEST_F(CrewdLimits, TooManyHeaderFieldsIs431) {
  std::string many;
  for (int i = 0; i < 60; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  const Exchange ex = send_request(port_, request_text("GET", "/healthz", "", many));
  ASSERT_EQ(ex.outcome, Outcome::response);
  EXPECT_EQ(ex.status, 431);
  EXPECT_NE(error_of(ex).find("http.header_count_limit (50)"), std::string::npos) << ex.body;
  // 50 is still fine.
  std::string fifty;
  for (int i = 0; i < 47; ++i) fifty += "X-" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(send_request(port_, request_text("GET", "/healthz", "", fifty)).status, 200);
}

TEST_F(CrewdLimits, ARequestLineOverTheLimitIs414) {
  const Exchange ex = get(port_, "/api/v1/factorial/" + std::string(5000, '0'));
  ASSERT_EQ(ex.outcome, Outcome::response);
  EXPECT_EQ(ex.status, 414);
}

// A client streaming an endless header section gets 431 as soon as the
// limit is passed, not after it has sent everything.
TEST_F(CrewdLimits, AnEndlessHeaderSectionIsCutAtTheLimit) {
  Socket s = connect_to(port_);
  ASSERT_TRUE(send_all(s.fd(), "GET /healthz HTTP/1.1\r\nHost: x\r\n"));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    const std::string line = "X-Filler: " + std::string(100, 'f') + "\r\n";
    for (int i = 0; i < 10'000 && !stop; ++i) {
      int err = 0;
      if (!write_all(s.fd(), line, err)) break;
    }
  });
  Responses in(s.fd());
  const Exchange ex = in.next(5'000ms);
  stop = true;
  ::shutdown(s.fd(), SHUT_WR);
  writer.join();
  ASSERT_EQ(ex.outcome, Outcome::response) << to_string(ex.outcome);
  EXPECT_EQ(ex.status, 431);
}

// ---- Content-Length, Transfer-Encoding, malformed heads: 400 at once ----

TEST_F(CrewdLimits, BadContentLengthsAreRefusedAtOnce) {
  struct Case {
    std::string head;
    std::string body;
    int status;
  };
  const std::string post = "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  const std::vector<Case> cases = {
      {post + "\r\n", "", 400},                                              // no body: not JSON
      {post + "Content-Length: 10000000000\r\n\r\n", "x", 413},              // over the limit
      {post + "Content-Length: -1\r\n\r\n", "x", 400},                       // negative
      {post + "Content-Length: abc\r\n\r\n", "x", 400},                      // not a number
      {post + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n", "xx", 400},  // conflicting
      {post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "0\r\n\r\n", 400},
      {post + "Transfer-Encoding: gzip\r\n\r\n", "x", 501},
      {post + "Transfer-Encoding: chunked, gzip\r\n\r\n", "x", 400},
      {post + "Transfer-Encoding: gzip, chunked\r\n\r\n", "0\r\n\r\n", 501},
      // chunked twice, in one field or two: malformed either way
      {post + "Transfer-Encoding: chunked, chunked\r\n\r\n", "0\r\n\r\n", 400},
      {post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "0\r\n\r\n", 400},
      {"GET /healthz HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", "", 400},
      {"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", "", 400},
      {"GET  /healthz HTTP/1.1\r\n\r\n", "", 400},
      // RFC 9112, 3.2: HTTP/1.1 needs exactly one Host field, 1.0 at most one.
      {"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", "", 400},
      {"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", "", 400},
      {"GET /healthz HTTP/1.0\r\nHost: x\r\nHost: x\r\n\r\n", "", 400},
      {"GET /healthz HTTP/1.0\r\n\r\n", "", 200},
  };
  for (const Case& c : cases) {
    const Exchange ex = send_request(port_, c.head + c.body, 2'000ms);
    ASSERT_EQ(ex.outcome, Outcome::response) << c.head << to_string(ex.outcome);
    EXPECT_EQ(ex.status, c.status) << c.head << ex.body;
    EXPECT_LT(ex.ended - ex.sent, 500ms * kSlowdown) << "at once: " << c.head;
  }
  // The same length twice is one length.
  const std::string body = R"({"kind":"sleep","ms":1})";
  const std::string len = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  const Exchange twice = send_request(port_, post + len + len + "\r\n" + body);
  EXPECT_EQ(twice.status, 200) << twice.body;
}

TEST_F(CrewdLimits, AChunkedBodyWorks) {
  const std::string body = R"({"kind":"sleep","ms":1,"name":"chunky"})";
  std::string req =
      "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  req += "5\r\n" + body.substr(0, 5) + "\r\n";
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%zx", body.size() - 5);
  req += std::string(hex) + "\r\n" + body.substr(5) + "\r\n0\r\n\r\n";
  const Exchange ex = send_request(port_, req);
  EXPECT_EQ(ex.status, 200) << ex.body;
  EXPECT_EQ(json_of(ex)["name"], "chunky");
}

// ---- Expect: 100-continue ----

// The head of a POST to `path` asking for 100 Continue before its body of
// `length` bytes.
std::string expect_continue_head(const std::string& path, std::size_t length) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
         std::to_string(length) + "\r\n\r\n";
}

TEST_F(CrewdLimits, ExpectContinueIsHonoured) {
  const std::string body = R"({"kind":"sleep","ms":1,"name":"expected"})";
  Socket s = connect_to(port_);
  ASSERT_TRUE(send_all(s.fd(), expect_continue_head("/api/v1/jobs", body.size())));
  Responses in(s.fd());
  const Exchange cont = in.next();
  ASSERT_EQ(cont.outcome, Outcome::response);
  EXPECT_EQ(cont.status, 100);
  ASSERT_TRUE(send_all(s.fd(), body));
  const Exchange ex = in.next();
  EXPECT_EQ(ex.status, 200) << ex.body;
  EXPECT_EQ(json_of(ex)["name"], "expected");
}

TEST_F(CrewdLimits, ExpectContinueWithAnOversizedLengthIs413WithoutContinue) {
  Socket s = connect_to(port_);
  ASSERT_TRUE(send_all(s.fd(), expect_continue_head("/api/v1/jobs", 100'000)));
  Responses in(s.fd());
  const auto sent = Clock::now();
  const Exchange ex = in.next();
  ASSERT_EQ(ex.outcome, Outcome::response);
  EXPECT_EQ(ex.status, 413) << "no 100 Continue first";
  EXPECT_LT(ex.ended - sent, 500ms * kSlowdown);
  EXPECT_EQ(ex.header("connection"), "close");
  EXPECT_TRUE(in.closed(3'000ms));
  EXPECT_EQ(in.pending(), "") << "one response, nothing after it";
}

TEST_F(CrewdLimits, ExpectContinueOnARouteWithoutBodyIsAnsweredAtOnce) {
  Socket s = connect_to(port_);
  ASSERT_TRUE(send_all(s.fd(), expect_continue_head("/nowhere", 100)));
  Responses in(s.fd());
  const Exchange ex = in.next();
  EXPECT_EQ(ex.status, 404);
  EXPECT_EQ(ex.header("connection"), "close");
  const Exchange other =
      send_request(port_, request_text("GET", "/healthz", "", "Expect: 200-ok\r\n"));
  EXPECT_EQ(other.status, 417);
}

// ---- Range is not for API routes ----

TEST_F(CrewdLimits, RangeIsIgnored) {
  for (const char* range : {"bytes=0-3", "bytes=100-200", "bytes=-5", "lines=1-2"}) {
    const Exchange ex = send_request(port_, request_text("GET", "/api/v1/factorial/5", "",
                                                         "Range: " + std::string(range) + "\r\n"));
    EXPECT_EQ(ex.status, 200) << range;
    EXPECT_EQ(ex.body, R"({"n":5,"result":120})") << range;
    EXPECT_EQ(ex.header("content-range"), "") << range;
  }
}

TEST_F(CrewdLimits, Http10ClosesAfterTheResponseUnlessAskedToKeepAlive) {
  Socket s = connect_to(port_);
  ASSERT_TRUE(send_all(s.fd(), "GET /healthz HTTP/1.0\r\n\r\n"));
  Responses in(s.fd());
  EXPECT_EQ(in.next().status, 200);
  EXPECT_TRUE(in.closed(2'000ms));
  Socket k = connect_to(port_);
  Responses kin(k.fd());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(send_all(k.fd(), "GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    const Exchange ex = kin.next();
    EXPECT_EQ(ex.status, 200);
    EXPECT_EQ(ex.header("connection"), "keep-alive");
  }
}

// ---- deadlines ----

TEST_F(CrewdLimits, AHeadTrickledTooSlowlyGets408AtItsDeadline) {
  Socket s = connect_to(port_);
  const auto start = Clock::now();
  ASSERT_TRUE(send_all(s.fd(), "GET /healthz HTTP/1.1\r\n"));
  // A byte every 100 ms: each read alone is quick, the head never ends.
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop) {
      int err = 0;
      if (!write_all(s.fd(), "X", err)) break;
      std::this_thread::sleep_for(100ms);
    }
  });
  Responses in(s.fd());
  const Exchange ex = in.next(5'000ms);
  stop = true;
  trickle.join();
  ASSERT_EQ(ex.outcome, Outcome::response) << to_string(ex.outcome);
  EXPECT_EQ(ex.status, 408);
  EXPECT_NE(error_of(ex).find("http.head_timeout_ms (800 ms)"), std::string::npos) << ex.body;
  const auto took = ex.ended - start;
  EXPECT_GE(took, 700ms);
  EXPECT_LT(took, 2'000ms * kSlowdown);
  EXPECT_TRUE(in.closed(3'000ms));
}

TEST_F(CrewdLimits, ABodyTooSlowGets408) {
  Socket s = connect_to(port_);
  ASSERT_TRUE(
      send_all(s.fd(), "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"));
  Responses in(s.fd());
  const Exchange ex = in.next(5'000ms);
  ASSERT_EQ(ex.outcome, Outcome::response) << to_string(ex.outcome);
  EXPECT_EQ(ex.status, 408);
  EXPECT_NE(error_of(ex).find("http.body_timeout_ms"), std::string::npos) << ex.body;
}

TEST_F(CrewdLimits, AnIdleKeepAliveConnectionIsClosedAtTheKeepAliveTimeout) {
  Socket s = connect_to(port_);
  ASSERT_TRUE(send_all(s.fd(), "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  Responses in(s.fd());
  EXPECT_EQ(in.next().status, 200);
  const auto idle = Clock::now();
  EXPECT_TRUE(in.closed(4'000ms));
  EXPECT_GE(Clock::now() - idle, 900ms);
  // A connection that never sends a byte, likewise.
  Socket silent = connect_to(port_);
  Responses none(silent.fd());
  EXPECT_TRUE(none.closed(4'000ms));
}

// Slow and idle connections cost the others nothing: /healthz answers in
// milliseconds while hundreds of them are open.
TEST_F(CrewdLimits, SlowAndIdleConnectionsDoNotStarveHealthz) {
  constexpr int kIdle = 300;
  constexpr int kSlow = 300;
  std::vector<Socket> idle;
  std::vector<Socket> slow;
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(connect_to(port_));
    ASSERT_GE(idle.back().fd(), 0);
  }
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(connect_to(port_));
    ASSERT_GE(slow.back().fd(), 0);
    ASSERT_TRUE(send_all(slow.back().fd(), "GET /healthz HTTP/1.1\r\nX-Slow: "));
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop) {
      for (auto& s : slow) {
        int err = 0;
        (void)write_all(s.fd(), "x", err);
      }
      std::this_thread::sleep_for(50ms);
    }
  });
  std::vector<double> ms;
  for (int i = 0; i < 50; ++i) {
    const Exchange ex = get(port_, "/healthz");
    ASSERT_EQ(ex.status, 200) << to_string(ex.outcome);
    ms.push_back(std::chrono::duration<double, std::milli>(ex.ended - ex.started).count());
    std::this_thread::sleep_for(5ms);
  }
  stop = true;
  trickle.join();
  std::sort(ms.begin(), ms.end());
  std::printf(
      "[ crewd    ] /healthz with %d idle and %d slow connections: p50 %.2f ms, max %.2f ms\n",
      kIdle, kSlow, ms[ms.size() / 2], ms.back());
  EXPECT_LT(ms[ms.size() * 9 / 10], 50.0 * kSlowdown);
}

// A client that sends requests and never reads the responses is cut at the
// write deadline; it holds nothing meanwhile.
TEST_F(CrewdLimits, AReaderThatNeverReadsIsCutAtTheWriteDeadline) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int small = 4096;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  std::string batch;
  for (int i = 0; i < 400; ++i) batch += "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  const int flags = ::fcntl(s.fd(), F_GETFL);
  ::fcntl(s.fd(), F_SETFL, flags | O_NONBLOCK);
  (void)::send(s.fd(), batch.data(), batch.size(), MSG_NOSIGNAL);  // as much as it takes
  // Never read. crewd fills the socket, then gives up at the deadline.
  const std::string closed =
      "crewd_http_connections_closed_total\\{reason=\"write_timeout\"\\} ([0-9]+)";
  bool cut = false;
  for (int i = 0; i < 100 * kSlowdown && !cut; ++i) {
    std::this_thread::sleep_for(50ms);
    const Exchange m = get(port_, "/metrics");
    const auto match = search(m.body, closed);
    cut = match && std::stoi((*match)[1]) > 0;
  }
  EXPECT_TRUE(cut);
}

// ---- memory ----

// Eight clients each sending a megabyte of headers get 431 early, and
// crewd's memory barely moves.
TEST_F(CrewdLimits, HugeHeaderSectionsCostNoMemory) {
  const std::size_t before = rss_bytes(crewd_->pid());
  std::vector<std::thread> clients;
  std::atomic<int> refused{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&] {
      Socket s = connect_to(port_);
      if (s.fd() < 0) return;
      std::atomic<bool> stop{false};
      std::thread writer([&] {
        std::string chunk = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
        const std::string line = "X-H: v\r\n";
        while (chunk.size() < (1u << 20)) chunk += line;
        int err = 0;
        (void)write_all(s.fd(), chunk, err);  // fails once crewd has closed
      });
      Responses in(s.fd());
      const Exchange ex = in.next(10'000ms);
      stop = true;
      ::shutdown(s.fd(), SHUT_RDWR);
      writer.join();
      if (ex.status == 431) ++refused;
    });
  }
  for (auto& t : clients) t.join();
  const std::size_t after = rss_bytes(crewd_->pid());
  std::printf("[ crewd    ] 8 x 1 MiB of headers: 431 x %d; RSS %.1f -> %.1f MiB\n", refused.load(),
              static_cast<double>(before) / (1 << 20), static_cast<double>(after) / (1 << 20));
  EXPECT_EQ(refused.load(), 8);
  EXPECT_LT(after, before + (8u << 20));
}

// ---- the connection limit ----

}  // namespace
}  // namespace crewd::test
