// Cores as fibers: the NPU's vector cores run in parallel; the model runs a launch's cores on as
// many threads as CPUs, several per thread as cooperatively switched fibers (a hand-written x86-64
// stack switch, StrataFiberSwitch; one thread per core elsewhere). A core switches out only where
// it waits, so it never loses the CPU between two model calls. In: a launch's cores and the kernel;
// out: every core run to its end (CoreMain, launch.cpp). Rules of runtime/README.md's table: none
// directly ("Vector cores are fibers on as many threads as CPUs" describes it).
#include "model_internal.h"

// Switches stacks (x86-64 System V): saves the callee-saved registers and the SSE/x87 control
// words on the current stack, stores its pointer in *from, loads `to` (a stack saved the same way)
// and returns on it. No signal mask is saved (swapcontext's two syscalls per switch); cores do not
// change it.
extern "C" void StrataFiberSwitch(void** from, void* to);
#if defined(__x86_64__)
__asm__(R"(
.text
.p2align 4
.type StrataFiberSwitch,@function
StrataFiberSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size StrataFiberSwitch,.-StrataFiberSwitch
)");
#define STRATA_HAVE_FIBERS 1
#else  // elsewhere every core has a thread of its own (LaunchThreads), so no fiber ever switches
extern "C" void StrataFiberSwitch(void**, void*) { std::abort(); }
#define STRATA_HAVE_FIBERS 0
#endif

namespace strata_cpu {

// ---- cores as fibers ----
// A launch runs its cores on T threads (T = the CPUs this process may run on, at most the launch's
// cores; STRATA_CPU_THREADS overrides): the launching thread is thread 0 and runs cores 0, T, 2T,
// ...; persistent worker thread t runs cores t, t+T, .... A thread with one core runs it directly;
// a thread with several runs each as a fiber (ucontext, a stack of its own per core, kept across
// launches) and switches between them where a core waits (flag waits, SyncAll, SDMA quiets, the
// modelled SQE cost, polling D-cache flushes): cooperative, so a core never loses the CPU between
// two model calls. Everything a core owns (CoreState, UB arena, D-cache, events, SDMA queue,
// counters) stays per core, whichever thread runs it.
namespace {

constexpr size_t kFiberStackBytes = 8u << 20;  // as a default thread stack
struct FiberSlot {
  void* sp = nullptr;  // saved stack pointer while switched out (StrataFiberSwitch)
  uint8_t* stack = nullptr;  // mmap'd once, guard page at the bottom
  bool done = false;
  bool waiting = false;  // its last switch-out was a wait (nothing to do until something happens)
  Launch* L = nullptr;
  BlockFn fn = nullptr;
  void* arg = nullptr;
};
FiberSlot g_fib[STRATA_MAX_CORES];

struct Sched {  // one thread's share of a launch
  void* home = nullptr;  // the scheduler's saved stack pointer while a fiber runs
  int cur = -1;
  int live = 0;  // its cores that have not returned
};
thread_local Sched* t_sched = nullptr;
}  // namespace

// Lets the other cores of this thread run (returns false, doing nothing, when none shares it).
// `waiting`: this core has nothing to do until another agent acts (the thread may sleep when all
// its cores wait).
bool CoreYield(bool waiting) {
  Sched* s = t_sched;
  if (!s || s->live <= 1) return false;
  CoreState* me = t_core;
  FiberSlot& f = g_fib[s->cur];
  f.waiting = waiting;
  StrataFiberSwitch(&f.sp, s->home);
  t_core = me;
  return true;
}

namespace {

// First code of a fiber (StrataFiberSwitch "returns" here on its new stack); never returns: it
// switches back to the scheduler for good.
void FiberStart() {
  Sched* s = t_sched;
  const int idx = s->cur;
  FiberSlot& f = g_fib[idx];
  CoreMain(f.L, idx, f.fn, f.arg);  // catches everything a kernel throws
  f.done = true;
  void* dead;
  StrataFiberSwitch(&dead, t_sched->home);
  std::abort();
}
}  // namespace

// Thread t of a launch on T threads: runs cores t, t+T, ... to their end (see "cores as fibers").
// Stacks are allocated by LaunchBlocks before the launch starts.
void RunCores(int t, int T, Launch* L, BlockFn fn, void* arg) {
  const int blocks = int(L->blocks);
  Sched s;
  t_sched = &s;
  if (t + T >= blocks) {  // one core on this thread: no fiber
    s.live = 1;
    s.cur = t;
    CoreMain(L, t, fn, arg);
    t_sched = nullptr;
    return;
  }
  for (int i = t; i < blocks; i += T) {
    FiberSlot& f = g_fib[i];
    f.L = L;
    f.fn = fn;
    f.arg = arg;
    f.done = false;
    f.waiting = false;
    // a fresh stack as StrataFiberSwitch leaves it: FP control words, six callee-saved registers
    // (zero), the "return" address FiberStart and a null frame above it (FiberStart starts with
    // rsp = 8 mod 16, as after a call)
    uint64_t* sp = reinterpret_cast<uint64_t*>(f.stack + kFiberStackBytes);
    *--sp = 0;
    *--sp = reinterpret_cast<uint64_t>(&FiberStart);
    for (int r = 0; r < 6; ++r) *--sp = 0;
    *--sp = 0;
    uint32_t mxcsr = 0x1f80;  // the defaults, replaced by this thread's
    uint16_t fpucw = 0x037f;
#if defined(__x86_64__)
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
#endif
    std::memcpy(reinterpret_cast<uint8_t*>(sp), &mxcsr, 4);
    std::memcpy(reinterpret_cast<uint8_t*>(sp) + 4, &fpucw, 2);
    f.sp = sp;
    ++s.live;
  }
  Idler idle;
  idle.spin = 0;  // see Idler
  while (s.live > 0) {
    bool busy = false;
    for (int i = t; i < blocks; i += T) {
      FiberSlot& f = g_fib[i];
      if (f.done) continue;
      s.cur = i;
      f.waiting = false;
      StrataFiberSwitch(&s.home, f.sp);
      if (f.done) {
        --s.live;
        busy = true;
      } else if (!f.waiting) {
        busy = true;
      }
    }
    if (busy)
      idle.Busy();
    else
      idle.Idle();  // every core of this thread waits
  }
  t_sched = nullptr;
  t_core = nullptr;
}

// CPUs this process may run on.
int MachineCpus() {
  static const int cpus = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
  }();
  return cpus;
}

// Threads a launch of `blocks` cores runs on.
int LaunchThreads(uint32_t blocks) {
  int n = MachineCpus();
  if (const char* e = getenv("STRATA_CPU_THREADS")) n = std::max(1, atoi(e));
  if (!STRATA_HAVE_FIBERS) n = int(blocks);
  return std::max(1, std::min<int>(n, int(blocks)));
}

// Fiber stacks for cores [0, blocks) that run as fibers; "" or why not.
std::string EnsureStacks(uint32_t blocks) {
  for (uint32_t i = 0; i < blocks; ++i) {
    FiberSlot& f = g_fib[i];
    if (f.stack) continue;
    void* p = mmap(nullptr, kFiberStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) return Sprintf("cannot map a stack for core %u: %s", i, strerror(errno));
    mprotect(p, 4096, PROT_NONE);  // guard page: an overflow faults instead of writing elsewhere
    f.stack = static_cast<uint8_t*>(p);
  }
  return "";
}

}  // namespace strata_cpu
