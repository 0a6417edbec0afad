// The request layer: every malformed input ends in a ParseError naming the
// field and its range, never in an exception.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <stop_token>
#include <string>
#include <variant>

#include "jobs/job_runner.hpp"
#include "jobs/jobs.hpp"

namespace crewd {
namespace {

const JobLimits kLimits{.max_ms = 10'000, .max_timeout_ms = 60'000, .default_timeout_ms = 5'000};

std::string error_of(std::string_view body) {
  const auto r = parse_job_request(body, kLimits);
  const auto* e = std::get_if<ParseError>(&r);
  return e == nullptr ? "<parsed>" : e->message;
}

JobRequest parsed(std::string_view body) {
  const auto r = parse_job_request(body, kLimits);
  if (const auto* e = std::get_if<ParseError>(&r)) ADD_FAILURE() << body << ": " << e->message;
  const auto* j = std::get_if<JobRequest>(&r);
  return j == nullptr ? JobRequest{} : *j;
}

TEST(CrewdFactorial, ComputesUpToTwentyInUint64) {
  EXPECT_EQ(factorial(0), 1u);
  EXPECT_EQ(factorial(1), 1u);
  EXPECT_EQ(factorial(5), 120u);
  EXPECT_EQ(factorial(20), 2432902008176640000ull);
}

TEST(CrewdFactorial, ParsesOnlyDecimalDigitsInRange) {
  EXPECT_EQ(std::get<unsigned>(parse_factorial_n("0")), 0u);
  EXPECT_EQ(std::get<unsigned>(parse_factorial_n("20")), 20u);
  EXPECT_EQ(std::get<unsigned>(parse_factorial_n("007")), 7u);
  EXPECT_EQ(std::get<unsigned>(parse_factorial_n("0000000005")), 5u);  // no length cap
  EXPECT_EQ(std::get<unsigned>(parse_factorial_n(std::string(100, '0') + "20")), 20u);
  EXPECT_EQ(std::get<unsigned>(parse_factorial_n("0000")), 0u);
  for (const char* bad : {"21", "-1", "+1", "1.0", "abc", "", " 1", "1 ", "0x10", "99999999999",
                          "18446744073709551617", "1e1", "0021", "100"}) {
    const auto r = parse_factorial_n(bad);
    ASSERT_TRUE(std::holds_alternative<ParseError>(r)) << "'" << bad << "'";
    EXPECT_EQ(std::get<ParseError>(r).message,
              "n must be an integer in 0..20 (larger ones overflow uint64)");
  }
}

TEST(CrewdJobRequest, TakesKindMsTimeoutAndName) {
  EXPECT_EQ(parsed(R"({"kind":"sleep","ms":200,"timeout_ms":1000,"name":"report-1"})"),
            (JobRequest{JobKind::sleep, 200, 1000, "report-1"}));
  EXPECT_EQ(parsed(R"({"kind":"spin","ms":0,"timeout_ms":1})"),
            (JobRequest{JobKind::spin, 0, 1, "spin"}));
  EXPECT_EQ(parsed(R"(  {"ms":10000, "kind":"sleep"}  )"),
            (JobRequest{JobKind::sleep, 10'000, 5'000, "sleep"}));
}

TEST(CrewdJobRequest, RefusesMalformedJson) {
  for (const char* body : {"", "{", "{\"kind\":", "nul", "{'kind':'sleep'}", "{\"a\":1,}",
                           "\xff\xfe", "{\"kind\":\"sleep\",\"ms\":1}x"}) {
    EXPECT_EQ(error_of(body), "body is not valid JSON") << body;
  }
  // A NUL byte ends nlohmann's input: what follows it was ignored.
  using namespace std::string_literals;
  for (const std::string& body :
       {"{\"kind\":\"sleep\",\"ms\":1}\0"s, "{\"kind\":\"sleep\",\"ms\":1}\0garbage"s,
        "{\"kind\":\"sleep\",\"name\":\"a\0b\",\"ms\":1}"s}) {
    EXPECT_EQ(error_of(body), "body is not valid JSON") << body.size() << " bytes";
  }
}

TEST(CrewdJobRequest, RefusesNonObjects) {
  for (const char* body : {"[]", "1", "\"sleep\"", "null", "true"}) {
    EXPECT_EQ(error_of(body), "body must be a JSON object") << body;
  }
}

TEST(CrewdJobRequest, RefusesMissingAndUnknownFields) {
  EXPECT_EQ(error_of(R"({"ms":1})"), "kind is required (\"sleep\" or \"spin\")");
  EXPECT_EQ(error_of(R"({"kind":"sleep"})"), "ms is required: ms must be an integer in 0..10000");
  EXPECT_EQ(error_of(R"({"kind":"sleep","ms":1,"tmeout_ms":5})"),
            "unknown field 'tmeout_ms' (fields: kind, ms, timeout_ms, name)");
  EXPECT_EQ(error_of(R"({"kind":"sleep","ms":1,"\u0001":5})"),
            "unknown field (unprintable or longer than 32 bytes) (fields: kind, ms, timeout_ms, "
            "name)");
}

TEST(CrewdJobRequest, RefusesNegativeNonIntegerAndOutOfRangeNumbers) {
  for (const char* ms : {"-1", "10001", "1.5", "1.0", "1e3", "\"5\"", "true", "null", "[1]",
                         "18446744073709551616", "-9223372036854775809"}) {
    EXPECT_EQ(error_of(std::string(R"({"kind":"sleep","ms":)") + ms + "}"),
              "ms must be an integer in 0..10000")
        << ms;
  }
  for (const char* t : {"0", "-5", "60001", "2.5", "\"100\""}) {
    EXPECT_EQ(error_of(std::string(R"({"kind":"sleep","ms":1,"timeout_ms":)") + t + "}"),
              "timeout_ms must be an integer in 1..60000")
        << t;
  }
}

TEST(CrewdJobRequest, RefusesUnknownKindsAndBadNames) {
  EXPECT_EQ(error_of(R"({"kind":"nap","ms":1})"), "kind must be \"sleep\" or \"spin\"");
  EXPECT_EQ(error_of(R"({"kind":1,"ms":1})"), "kind must be \"sleep\" or \"spin\"");
  const std::string must = "name must be a string of 1..64 characters from [A-Za-z0-9._:-]";
  EXPECT_EQ(error_of(R"({"kind":"sleep","ms":1,"name":""})"), must);
  EXPECT_EQ(error_of(R"({"kind":"sleep","ms":1,"name":"a b"})"), must);
  EXPECT_EQ(error_of(R"({"kind":"sleep","ms":1,"name":7})"), must);
  EXPECT_EQ(error_of(R"({"kind":"sleep","ms":1,"name":")" + std::string(65, 'x') + "\"}"), must);
  EXPECT_EQ(parsed(R"({"kind":"sleep","ms":1,"name":")" + std::string(64, 'x') + "\"}").name,
            std::string(64, 'x'));
}

TEST(CrewdJobRequest, StuckKindOnlyWhenAllowed) {
  EXPECT_EQ(error_of(R"({"kind":"stuck","ms":1})"), "kind must be \"sleep\" or \"spin\"");
  JobLimits allowing = kLimits;
  allowing.allow_stuck = true;
  const auto r = parse_job_request(R"({"kind":"stuck","ms":5,"name":"hang"})", allowing);
  const auto* j = std::get_if<JobRequest>(&r);
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->kind, JobKind::stuck);
  EXPECT_EQ(to_string(j->kind), "stuck");
}

using OptText = std::optional<std::string>;

JobHeaders headers(OptText priority, OptText deadline) {
  const auto r = parse_job_headers(priority, deadline, kLimits);
  if (const auto* e = std::get_if<ParseError>(&r)) ADD_FAILURE() << e->message;
  const auto* h = std::get_if<JobHeaders>(&r);
  return h == nullptr ? JobHeaders{} : *h;
}

std::string header_error(OptText priority, OptText deadline) {
  const auto r = parse_job_headers(priority, deadline, kLimits);
  const auto* e = std::get_if<ParseError>(&r);
  return e == nullptr ? "<parsed>" : e->message;
}

TEST(CrewdJobHeaders, TakesPriorityNamesOrLevelsAndADeadline) {
  EXPECT_EQ(headers(std::nullopt, std::nullopt), (JobHeaders{JobPriority::normal, std::nullopt}));
  EXPECT_EQ(headers("high", std::nullopt).priority, JobPriority::high);
  EXPECT_EQ(headers("Low", std::nullopt).priority, JobPriority::low);
  EXPECT_EQ(headers("NORMAL", std::nullopt).priority, JobPriority::normal);
  EXPECT_EQ(headers("0", std::nullopt).priority, JobPriority::low);
  EXPECT_EQ(headers("2", std::nullopt).priority, JobPriority::high);
  EXPECT_EQ(headers(std::nullopt, "1").deadline_ms, 1u);
  EXPECT_EQ(headers("1", "60000"), (JobHeaders{JobPriority::normal, 60'000u}));
  EXPECT_EQ(headers(std::nullopt, "0250").deadline_ms, 250u);
  EXPECT_EQ(to_string(JobPriority::high), "high");
}

TEST(CrewdJobHeaders, RefusesBadValuesNamingTheHeader) {
  const std::string priority = "X-Priority must be high, normal or low, or a level in 0..2";
  for (const char* bad : {"", "3", "urgent", "hi", "high ", "02", "-1", "1.0"}) {
    EXPECT_EQ(header_error(std::string(bad), std::nullopt), priority) << bad;
  }
  const std::string deadline = "X-Deadline-Ms must be an integer in 1..60000";
  for (const char* bad : {"", "0", "-5", "+5", "5ms", "1.5", "60001", "99999999999", " 5"}) {
    EXPECT_EQ(header_error(std::nullopt, std::string(bad)), deadline) << bad;
  }
}

// A stuck job sleeps through a stop request; sleep and spin end at once.
TEST(CrewdJobRunner, OnlyTheStuckKindIgnoresItsStopToken) {
  std::stop_source stop;
  stop.request_stop();
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  EXPECT_FALSE(run_job_until({.kind = JobKind::sleep, .ms = 50, .timeout_ms = 0, .name = {}}, until,
                             stop.get_token()));
  EXPECT_FALSE(run_job_until({.kind = JobKind::spin, .ms = 50, .timeout_ms = 0, .name = {}}, until,
                             stop.get_token()));
  EXPECT_TRUE(run_job_until({.kind = JobKind::stuck, .ms = 50, .timeout_ms = 0, .name = {}}, until,
                            stop.get_token()));
  EXPECT_GE(std::chrono::steady_clock::now(), until);
}

TEST(CrewdJobRequest, CallKindOnlyWithACallUrlAndWithoutMs) {
  EXPECT_EQ(error_of(R"({"kind":"call"})"),
            "kind \"call\" needs a downstream: jobs.call_url is not set");
  JobLimits calling;
  calling.allow_call = true;
  const auto r = parse_job_request(R"({"kind":"call","timeout_ms":300,"name":"fetch"})", calling);
  const auto* j = std::get_if<JobRequest>(&r);
  ASSERT_NE(j, nullptr) << std::get<ParseError>(r).message;
  EXPECT_EQ(*j, (JobRequest{.kind = JobKind::call, .ms = 0, .timeout_ms = 300, .name = "fetch"}));
  EXPECT_EQ(to_string(JobKind::call), "call");
  const auto with_ms = parse_job_request(R"({"kind":"call","ms":5})", calling);
  ASSERT_TRUE(std::holds_alternative<ParseError>(with_ms));
  EXPECT_EQ(std::get<ParseError>(with_ms).message,
            "ms does not apply to kind \"call\" (it waits for the downstream's answer)");
  const auto unknown = parse_job_request(R"({"kind":"nap","ms":5})", calling);
  ASSERT_TRUE(std::holds_alternative<ParseError>(unknown));
  EXPECT_EQ(std::get<ParseError>(unknown).message, "kind must be \"sleep\", \"spin\" or \"call\"");
}

TEST(CrewdHttpUrl, TakesHostPortAndPathOfAnHttpUrl) {
  EXPECT_EQ(parse_http_url("http://127.0.0.1:8081/slow"),
            (HttpUrl{.host = "127.0.0.1", .port = 8081, .target = "/slow"}));
  EXPECT_EQ(parse_http_url("http://downstream.svc"),
            (HttpUrl{.host = "downstream.svc", .port = 80, .target = "/"}));
  for (const char* bad :
       {"", "https://a/x", "http://", "http://:80/x", "http://a:0/x", "http://a:65536/x",
        "http://a:/x", "http://a:8x/x", "http://u@a/x", "http://a/x?q=1", "http://a/x#f",
        "http://a/x y", "http://[::1]:80/x", "ftp://a/x"}) {
    EXPECT_EQ(parse_http_url(bad), std::nullopt) << bad;
  }
}

TEST(CrewdJobRequest, SurvivesDeepNesting) {
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  EXPECT_EQ(error_of(deep), "body must be a JSON object");
  EXPECT_EQ(error_of(std::string(100'000, '[')), "body is not valid JSON");
}

}  // namespace
}  // namespace crewd
