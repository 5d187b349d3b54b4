// Persistent workers: the threads a rank process keeps for its launches (T-1 core threads, one SDMA
// engine thread per core that has posted a copy), handed each launch's share of the cores, stopped
// by strata_cpu_finalize, the library's unloading or the process's exit, and forgotten in a forked
// child. In: jobs from LaunchBlocks; out: finished cores. Rules of runtime/README.md's table: none.
// This file sorts last among runtime/cpu/src/*.cpp and the build links them in sorted order, so its
// statics (WorkerReaper) are constructed last and destroyed first, as when they ended the single model.cpp.
#include "model_internal.h"

namespace strata_cpu {

// Never destroyed: its threads may outlive the library's static destructors (see WorkerReaper).
WorkerPool* g_workers = new WorkerPool;

namespace {

void CoreWorkerMain(CoreWorker* w) {
  uint64_t seen = 0;
  for (;;) {
    CoreJob job;
    {
      std::unique_lock<std::mutex> lk(w->mu);
      w->cv.wait(lk, [&] { return w->stop || w->gen != seen; });
      if (w->stop) return;
      seen = w->gen;
      job = w->job;
    }
    RunCores(w->idx, job.threads, job.L, job.fn, job.ctx);  // CoreMain catches everything a kernel throws
    WorkerPool* pool = w->pool;
    std::lock_guard<std::mutex> lk(pool->done_mu);
    if (--pool->pending == 0) pool->done_cv.notify_one();
  }
}
}  // namespace

// Starts core workers until there are `blocks`; "" or why one could not be started.
std::string GrowWorkers(WorkerPool* pool, uint32_t workers) {
  while (pool->cores.size() < workers) {
    CoreWorker* w = new CoreWorker;
    w->pool = pool;
    w->idx = int(pool->cores.size()) + 1;
    try {
      w->thread = std::thread(CoreWorkerMain, w);
    } catch (const std::exception& e) {
      std::string why = Sprintf("cannot start core thread %d: %s", w->idx, e.what());
      delete w;
      return why;
    }
    pool->cores.push_back(w);
  }
  return "";
}

namespace {

// Stops and joins every worker thread of the process (no launch may be running: the caller holds
// launch_mu). The pool is empty afterwards and grows again at the next launch.
void StopWorkersLocked(WorkerPool* pool) {
  for (CoreWorker* w : pool->cores) {
    {
      std::lock_guard<std::mutex> lk(w->mu);
      w->stop = true;
    }
    w->cv.notify_one();
  }
  for (CoreWorker* w : pool->cores) {
    if (w->thread.joinable()) w->thread.join();
    delete w;
  }
  pool->cores.clear();
  for (SdmaEngine*& e : pool->sdma) {
    if (!e) continue;
    {
      std::lock_guard<std::mutex> lk(e->mu);
      e->stop = true;
      e->queue.clear();
    }
    e->cv_work.notify_all();
    if (e->worker.joinable()) e->worker.join();
    delete e;
    e = nullptr;
  }
}
}  // namespace

// Stops the workers. `wait`: after the running launch, if any (strata_cpu_finalize: the pool is
// about to be unmapped, so no launch may still run on it); otherwise only if none is running (at
// exit, a launch's threads are left alone, as before). Never from one of a launch's own threads.
void StopWorkers(bool wait) {
  WorkerPool* pool = g_workers;
  if (t_core) return;
  std::unique_lock<std::mutex> lk(pool->launch_mu, std::defer_lock);
  if (wait) {
    lk.lock();
  } else if (!lk.try_lock()) {
    return;
  }
  StopWorkersLocked(pool);
}

namespace {

// At the library's unloading (dlclose) or the process's exit: idle workers are joined, so that no
// thread is left waiting in code that is about to be unmapped. Defined after every other global
// of this file, so destroyed before them.
struct WorkerReaper {
  ~WorkerReaper() { StopWorkers(false); }
};

// A child forked while workers exist has none of their threads: it starts its own.
void ForgetWorkersInChild() { g_workers = new WorkerPool; }
struct AtForkRegistration {
  AtForkRegistration() { pthread_atfork(nullptr, nullptr, ForgetWorkersInChild); }
};
AtForkRegistration g_atfork;
WorkerReaper g_reaper;
}  // namespace

}  // namespace strata_cpu
