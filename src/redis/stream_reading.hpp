// src/redis/stream_reading.hpp (private): what a StreamSource reads
// before it runs anything: its options, checked and completed
// (validated), and the entries of a stream reply (entries_of). No state;
// called by the constructor and by the reader thread.
#pragma once

#include <hiredis/hiredis.h>

#include <string>
#include <vector>

#include "crew/pool.hpp"
#include "crew/stream_source.hpp"

namespace crew::detail {

// Throws Error(invalid_options) for StreamSourceOptions.<field>.
[[noreturn]] void invalid_option(const std::string& field, const std::string& why);

// The options with their defaults filled in (consumer, instance_id,
// max_in_flight from the pool, logger). Throws Error(invalid_options)
// naming the field.
StreamSourceOptions validated(StreamSourceOptions o, const Pool& pool);

// An entry as read: its job, or (`refused` not empty) why it is too large
// to run, with no field copied.
struct Entry {
  Job job;
  std::string refused;
};

// Entries of an XREADGROUP / XAUTOCLAIM reply: [[id, [field, value, ...]], ...];
// an entry over max_entry_fields or max_entry_bytes has `refused` set.
std::vector<Entry> entries_of(const redisReply* entries, const StreamSourceOptions& o);

}  // namespace crew::detail
