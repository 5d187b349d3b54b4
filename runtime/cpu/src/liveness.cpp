// Liveness of the pool's ranks: on the NPU a dead peer leaves its partners hanging; the model tells
// a dead rank from a slow one. A rank records its pid and start time when it maps the pool and marks
// itself as left when it unmaps it (strata_cpu_leave); a joined rank whose process is gone, a
// zombie or a reused pid is dead (DeadRank). Also the active-rank mask of masked calls and whether
// all ranks share one scheduling group (OneSchedGroup, for the idler). In: the pool header's rank
// slots and /proc; out: the lowest dead rank and why. Rule of runtime/README.md's table: "dead
// peers" (DeadRank).
#include "model_internal.h"

namespace strata_cpu {

// ---------------------------------------------------------------------------------------------
// Liveness of the pool's ranks. A rank records its pid and start time when it maps the pool and
// marks itself as left when it unmaps it (or exits through strata_cpu_leave). A joined rank whose
// process is gone, a zombie, or a different process under a reused pid is dead: waits check this
// (at most every kPeerCheckSec per process) and stop instead of running into their deadline.

namespace {

// Reads state and start time of /proc/<pid>/stat; false if the process does not exist.
bool ProcStat(int pid, char* state, uint64_t* start) {
  char path[64];
  if (pid > 0)
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
  else
    snprintf(path, sizeof path, "/proc/self/stat");
  FILE* f = fopen(path, "r");
  if (!f) return false;
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (!p) return false;
  ++p;
  // fields after the name: 3 state, 4 ppid, ..., 22 starttime
  int field = 2;
  *state = '?';
  *start = 0;
  while (*p) {
    while (*p == ' ') ++p;
    if (!*p) break;
    ++field;
    if (field == 3) *state = *p;
    if (field == 22) {
      *start = strtoull(p, nullptr, 10);
      break;
    }
    while (*p && *p != ' ') ++p;
  }
  return true;
}

}  // namespace

uint64_t SelfStart() {
  char state;
  uint64_t start = 0;
  ProcStat(0, &state, &start);
  return start;
}

namespace {


// Why the process of a joined rank is not alive, or "" if it is.
std::string WhyDead(const RankSlot& slot) {
  int pid = slot.pid;
  if (pid <= 0) return "";
  if (kill(pid, 0) != 0 && errno == ESRCH) return Sprintf("process %d no longer exists", pid);
  char state;
  uint64_t start;
  if (!ProcStat(pid, &state, &start)) {
    if (errno == ENOENT) return Sprintf("process %d no longer exists", pid);
    return "";  // no /proc: kill(pid, 0) is all we can tell
  }
  if (state == 'Z' || state == 'X') return Sprintf("process %d has exited (a zombie, not yet reaped)", pid);
  if (slot.start != 0 && start != 0 && start != slot.start)
    return Sprintf("process %d has exited (its pid now belongs to another process)", pid);
  return "";
}

std::mutex g_live_mu;

bool ActiveRank(int r) { return ((CurPool().active[r / 64].load() >> (r % 64)) & 1ull) != 0; }
}  // namespace

// The lowest rank whose process died without leaving the pool, or -1 (why: what happened); with
// `masked`, only ranks live in the active mask count. Scans at most every kPeerCheckSec per
// process; callers in between get the last answer. A rank found dead stays dead.
int DeadRank(std::string* why, bool force, bool masked) {
  if (!CurPool().inited) return -1;
  std::unique_lock<std::mutex> lk(g_live_mu, std::defer_lock);
  if (force) {
    lk.lock();
  } else if (!lk.try_lock()) {
    return -1;  // another core is scanning right now
  }
  const int n = CurPool().world < kMaxWorld ? CurPool().world : kMaxWorld;
  if (static_cast<int>(CurPool().live_why.size()) != n) CurPool().live_why.assign(n, std::string());
  double now = Now();
  if (force || now >= CurPool().live_next) {
    CurPool().live_next = now + kPeerCheckSec;
    int me_pid = getpid();
    for (int r = 0; r < n; ++r) {
      if (r == CurPool().rank || !CurPool().live_why[r].empty()) continue;
      RankSlot slot;
      slot.state = __atomic_load_n(&CurPool().hdr->ranks[r].state, __ATOMIC_ACQUIRE);
      if (slot.state != kRankJoined) continue;
      slot.pid = __atomic_load_n(&CurPool().hdr->ranks[r].pid, __ATOMIC_ACQUIRE);
      slot.start = __atomic_load_n(&CurPool().hdr->ranks[r].start, __ATOMIC_ACQUIRE);
      if (slot.pid == me_pid) continue;
      std::string w = WhyDead(slot);
      // it may have left in between
      if (w.empty() || __atomic_load_n(&CurPool().hdr->ranks[r].state, __ATOMIC_ACQUIRE) != kRankJoined) continue;
      CurPool().live_why[r] = Sprintf("rank %d is gone: %s (killed or crashed) without leaving the pool", r, w.c_str());
    }
  }
  for (int r = 0; r < n; ++r) {
    if (CurPool().live_why[r].empty() || (masked && !ActiveRank(r))) continue;
    if (why) *why = CurPool().live_why[r];
    return r;
  }
  return -1;
}

namespace {

// Whether every rank of the pool runs in this process's session. With the kernel's autogroup
// scheduling (sched_autogroup_enabled, on by default) each session is a scheduling group of its
// own and sched_yield never hands the CPU to another group: a rank that yields while a peer of
// another session waits for the CPU keeps it until the tick (4 ms at HZ=250), so the oversubscribed
// yield phase is used only when all ranks share the session (`stratac run` and `stratac bench` start
// them in the runner's, as mpirun does its ranks). Known once every rank has joined; kept per pool.
}  // namespace

bool OneSchedGroup() {
  std::lock_guard<std::mutex> lk(g_live_mu);
  if (CurPool().one_group >= 0) return CurPool().one_group == 1;
  if (!CurPool().inited) return false;
  const pid_t mine = getsid(0);
  for (int r = 0; r < CurPool().world && r < kMaxWorld; ++r) {
    if (r == CurPool().rank) continue;
    if (__atomic_load_n(&CurPool().hdr->ranks[r].state, __ATOMIC_ACQUIRE) != kRankJoined) return false;
    pid_t pid = __atomic_load_n(&CurPool().hdr->ranks[r].pid, __ATOMIC_ACQUIRE);
    if (getsid(pid) != mine) {
      CurPool().one_group = 0;
      return false;
    }
  }
  CurPool().one_group = 1;
  return true;
}


}  // namespace strata_cpu


using namespace strata_cpu;

extern "C" {

STRATA_EXPORT int strata_cpu_dead_rank(void) {
  std::string why;
  int r = DeadRank(&why, /*force=*/true);
  if (r >= 0) SetLastError(why);
  return r;
}

STRATA_EXPORT void strata_cpu_set_active_ranks(const uint64_t* words, int count) {
  for (int i = 0; i < kMaxWorld / 64; ++i) CurPool().active[i].store(i < count ? words[i] : ~0ull);
}

STRATA_EXPORT void strata_cpu_leave(void) {
  if (CurPool().inited) {
    __atomic_store_n(&CurPool().hdr->ranks[CurPool().rank].state, int32_t(kRankLeft), __ATOMIC_RELEASE);
    Notify();
  }
}

}  // extern "C"
