#include "crew/error.hpp"

namespace crew {

std::string_view to_string(Admission a) noexcept {
  switch (a) {
    case Admission::accepted:
      return "accepted";
    case Admission::closed:
      return "closed";
    case Admission::full:
      return "full";
    case Admission::too_many_blocked:
      return "too_many_blocked";
    case Admission::overloaded:
      return "overloaded";
  }
  return "unknown";
}

std::string_view to_string(Errc e) noexcept {
  switch (e) {
    case Errc::invalid_options:
      return "invalid options";
    case Errc::rejected:
      return "rejected at submission";
    case Errc::shutdown_dropped:
      return "dropped from the queue by a shutdown";
    case Errc::expired:
      return "expired in the queue";
    case Errc::cancelled:
      return "cancelled";
    case Errc::timed_out:
      return "timed out";
    case Errc::abandoned:
      return "abandoned after its deadline";
    case Errc::empty_handle:
      return "empty handle";
    case Errc::would_deadlock:
      return "called from a task it would wait for";
    case Errc::stack_exhausted:
      return "not run: the waiting worker's stack was exhausted";
    case Errc::overloaded:
      return "shed by the overload controller";
    case Errc::wait_in_fork:
      return "a forked child cannot suspend its task";
  }
  return "unknown";
}

std::string_view to_string(OverloadReason r) noexcept {
  switch (r) {
    case OverloadReason::none:
      return "none";
    case OverloadReason::limit:
      return "limit";
    case OverloadReason::codel:
      return "codel";
    case OverloadReason::priority:
      return "priority";
    case OverloadReason::deadline:
      return "deadline";
    case OverloadReason::rate:
      return "rate";
  }
  return "unknown";
}

}  // namespace crew
