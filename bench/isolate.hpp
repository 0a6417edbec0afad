// bench/isolate.hpp: a measurement in a child process, so that a run that
// crashes (a worker overflowing its stack) or hangs is reported as such in
// its row instead of ending the benchmark.
#pragma once

#include <functional>

#include "harness.hpp"

namespace bench {

// Forks; the child runs `body` and sends its Sample back through a pipe.
// The child inherits the parent's memory (copy-on-write) and starts with no
// other thread, so `body` must build everything it uses (a fresh pool) and
// must not touch oneTBB, whose threads do not survive a fork. A child that
// dies from a signal gives a Sample whose failure names it ("SIGSEGV"); one
// still running after `timeout_seconds` is killed ("timeout after N s"). A
// failed check in the child (fail()) stops the whole benchmark, as in the
// parent. Core dumps are off in the child.
Sample run_isolated(int timeout_seconds, const std::function<Sample()>& body);

}  // namespace bench
