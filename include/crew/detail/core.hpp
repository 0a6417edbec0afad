// crew/detail/core.hpp: kept for one release. The pool's core is
// detail::PoolCore, in crew/detail/pool_core.hpp; include that instead.
#pragma once

#include "crew/detail/pool_core.hpp"

namespace crew::detail {

using Core = PoolCore;

}  // namespace crew::detail
