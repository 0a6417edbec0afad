// crew/crew.hpp: the whole public API of the crew library in one include.
//
//   pool.hpp          crew::Pool, the worker pool (options, stats, shutdown)
//   task.hpp          crew::Task<R> handles, TaskOptions, TaskContext
//   group.hpp         crew::Group: tasks waited for and cancelled together
//   batch.hpp         run_batch: a set of tasks to completion
//   parallel_for.hpp  parallel_for, parallel_for_blocks: loops over an index range
//   func_pool.hpp     crew::FuncPool<Arg>: a pool with one fixed handler
//   sharded_pool.hpp  crew::ShardedPool: N pools behind one submit
//   application.hpp   crew::Application, the lifecycle of a service process
//   observer.hpp      crew::Observer, the hook for metrics and tracing
//   log.hpp           crew::Logger
//   usable_cpus.hpp   crew::usable_cpus(): the CPUs defaults are sized from
//
// Optional components are included on their own: the Redis Streams source
// (crew/stream_source.hpp, target crew::redis), and the Prometheus exporter
// and spdlog adapter where they are built.
#pragma once

#include "crew/application.hpp"
#include "crew/batch.hpp"
#include "crew/coro.hpp"
#include "crew/error.hpp"
#include "crew/func_pool.hpp"
#include "crew/group.hpp"
#include "crew/log.hpp"
#include "crew/observer.hpp"
#include "crew/overload.hpp"
#include "crew/parallel_for.hpp"
#include "crew/pool.hpp"
#include "crew/pool_types.hpp"
#include "crew/sharded_pool.hpp"
#include "crew/stacktrace.hpp"
#include "crew/task.hpp"
#include "crew/task_status.hpp"
#include "crew/usable_cpus.hpp"
