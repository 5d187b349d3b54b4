// SIGINT and SIGTERM while a launch runs: the host's Ctrl-C reaches a rank whose thread is inside a
// kernel. OnHostSignal records the signal (AbortCheck then fails the launch, which aborts the pool,
// so the peers' waits stop too, naming it) and hands it on to the handler it replaced; a default
// action is held back for the host (strata_cpu_take_signal). In: the signal; out: a failed launch.
// Rules of runtime/README.md's table: none (docs/robustness.md describes the behaviour).
#include "model_internal.h"

namespace strata_cpu {

// ---- SIGINT and SIGTERM while a launch runs ----
// The host thread blocks in LaunchBlocks (cffi releases the GIL; Python runs its signal handlers
// only in the main thread, between bytecodes), so without this a signal would wait for the launch
// to end: for a wait on a peer that never arrives, its timeout. strata_cpu_watch_signals (the
// communicator's, for its lifetime) puts OnHostSignal on both signals (not on one the process
// ignores). Outside a launch it only hands the signal on to the handler it replaced, exactly as if
// it were not there (the default action is re-raised). During a launch it also records the signal
// (one lock-free atomic store: async-signal-safe), so that every kernel wait sees it at its next
// poll (AbortCheck) and fails the launch like any rule violation: the pool is aborted, so the
// peers' waits on this rank stop too, naming the signal. Python's own handler still gets the signal
// and runs once the launch returns (SIGINT: KeyboardInterrupt); when the replaced action is the
// default (SIGTERM's, unless the host set a handler) the signal is held back instead of killing the
// process inside the kernel, for the host to end it cleanly (strata_cpu_take_signal). Installed
// once rather than around each launch: the four system calls of installing and restoring cost about
// 4 us per launch (7 % of a 4 KiB AllReduce on the model).
std::atomic<int> g_host_signal{0};     // the signal that arrived during this launch, 0 if none
std::atomic<bool> g_in_launch{false};  // LaunchBlocks runs kernels
namespace {

std::atomic<int> g_held_signal{0};     // one whose action was the default, held for the host
const int kWatchedSignals[2] = {SIGINT, SIGTERM};
struct sigaction g_replaced[2];

void OnHostSignal(int sig, siginfo_t* info, void* uc) {
  const int saved = errno;
  const int i = sig == SIGINT ? 0 : 1;
  const struct sigaction& prev = g_replaced[i];
  const bool in_launch = g_in_launch.load();
  if (in_launch) g_host_signal.store(sig);
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, uc);
  } else if (prev.sa_handler == SIG_DFL) {
    if (in_launch) {
      g_held_signal.store(sig);
    } else {   // as if this handler were not there: the default action, once this returns
      sigaction(sig, &prev, nullptr);
      raise(sig);
    }
  } else if (prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  }
  errno = saved;
}

bool Watching(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == OnHostSignal;
}
}  // namespace

}  // namespace strata_cpu


using namespace strata_cpu;

extern "C" {

STRATA_EXPORT int strata_cpu_take_signal(void) { return g_held_signal.exchange(0); }

STRATA_EXPORT void strata_cpu_watch_signals(int on) {
  for (int i = 0; i < 2; ++i) {
    struct sigaction cur;
    if (sigaction(kWatchedSignals[i], nullptr, &cur) != 0) continue;
    if (!on) {
      if (Watching(cur)) sigaction(kWatchedSignals[i], &g_replaced[i], nullptr);
      continue;
    }
    if (Watching(cur) || (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)) continue;
    g_replaced[i] = cur;   // before the handler that reads it is installed
    struct sigaction mine;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = OnHostSignal;
    mine.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&mine.sa_mask);
    sigaction(kWatchedSignals[i], &mine, nullptr);
  }
}

}  // extern "C"
