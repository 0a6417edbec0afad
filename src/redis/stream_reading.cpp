// The reading side of StreamSource (stream_reading.hpp): its options'
// check and the parsing of stream replies.
#include "stream_reading.hpp"

#include <unistd.h>

#include <cstdio>
#include <utility>

#include "crew/error.hpp"
#include "redis_conn.hpp"

namespace crew::detail {
namespace {

// Why an entry's fields ([field, value, ...]) are over the limits; empty if
// they are not. Only lengths are read.
std::string oversize_of(const redisReply* kv, const StreamSourceOptions& o) {
  const std::size_t fields = kv->elements / 2;
  if (fields > o.max_entry_fields) {
    return "entry has " + std::to_string(fields) + " fields, over max_entry_fields " +
           std::to_string(o.max_entry_fields);
  }
  std::size_t bytes = 0;
  for (std::size_t k = 0; k < kv->elements; ++k) bytes += text_of(kv->element[k]).size();
  if (bytes > o.max_entry_bytes) {
    return "entry has " + std::to_string(bytes) + " bytes of fields, over max_entry_bytes " +
           std::to_string(o.max_entry_bytes);
  }
  return {};
}

}  // namespace

StreamSourceOptions validated(StreamSourceOptions o, const Pool& pool) {
  if (o.host.empty()) invalid_option("host", "must not be empty");
  if (o.port <= 0 || o.port > 65535)
    invalid_option("port", std::to_string(o.port) + " is not a port");
  for (const auto& [name, value] : {std::pair<const char*, const std::string*>{"stream", &o.stream},
                                    {"group", &o.group},
                                    {"results_stream", &o.results_stream},
                                    {"dead_letter_stream", &o.dead_letter_stream}}) {
    if (value->empty()) invalid_option(name, "must not be empty");
  }
  if (o.max_batch == 0) invalid_option("max_batch", "must be positive");
  if (o.max_attempts == 0) invalid_option("max_attempts", "must be at least 1");
  if (o.block.count() <= 0) invalid_option("block", "must be positive");
  if (o.claim_idle.count() <= 0) invalid_option("claim_idle", "must be positive");
  if (o.retry_backoff.count() < 0) invalid_option("retry_backoff", "must not be negative");
  if (o.reconnect_min.count() <= 0) invalid_option("reconnect_min", "must be positive");
  if (o.reconnect_max < o.reconnect_min) invalid_option("reconnect_max", "is below reconnect_min");
  if (o.command_timeout.count() <= 0) invalid_option("command_timeout", "must be positive");
  if (o.job_timeout.count() < 0) invalid_option("job_timeout", "must not be negative");
  if (o.priority >= pool.options().priority_levels) {
    invalid_option("priority", std::to_string(o.priority) + " is not below the pool's " +
                                   std::to_string(pool.options().priority_levels) + " levels");
  }
  if (o.overload_backoff_min.count() <= 0) {
    invalid_option("overload_backoff_min", "must be positive");
  }
  if (o.overload_backoff_max < o.overload_backoff_min) {
    invalid_option("overload_backoff_max", "is below overload_backoff_min");
  }
  if (o.max_entry_bytes == 0) invalid_option("max_entry_bytes", "must be positive");
  if (o.max_entry_fields == 0) invalid_option("max_entry_fields", "must be positive");
  if (o.consumer.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "host");
    o.consumer = std::string(host) + "-" + std::to_string(getpid());
  }
  if (o.instance_id.empty()) o.instance_id = o.consumer;
  if (o.max_in_flight == 0) o.max_in_flight = pool.options().max_workers;
  if (!o.logger) o.logger = default_logger();
  return o;
}

void invalid_option(const std::string& field, const std::string& why) {
  throw Error(Errc::invalid_options, "crew::StreamSourceOptions." + field + ": " + why);
}

std::vector<Entry> entries_of(const redisReply* entries, const StreamSourceOptions& o) {
  std::vector<Entry> out;
  if (entries == nullptr || entries->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i < entries->elements; ++i) {
    const redisReply* e = entries->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2) continue;
    Entry entry;
    entry.job.id = std::string(text_of(e->element[0]));
    const redisReply* kv = e->element[1];
    if (kv->type == REDIS_REPLY_ARRAY) {
      entry.refused = oversize_of(kv, o);
      for (std::size_t k = 0; entry.refused.empty() && k + 1 < kv->elements; k += 2) {
        entry.job.fields.emplace_back(text_of(kv->element[k]), text_of(kv->element[k + 1]));
      }
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace crew::detail
