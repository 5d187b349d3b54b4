// Counters and the trace: what a profiler of the NPU would show. Per-core counters of DMA bytes in
// and out, SDMA bytes, posts and SQEs, remote reads and writes (strata_cpu_read_counters), and
// trace spans (strata_cpu_trace_*: a core's kernel, its strata: stages, waits, quiets and SDMA
// copies, on CLOCK_MONOTONIC, written as Chrome trace events), and the cost accounting of a launch
// (strata_cpu_costs_enable, strata_cpu_read_costs: where each core's time went). Also the settings every later
// launch reads: the wait timeout and the SoC's vector core count. In: counts and spans from the
// other files; out: the host's reads. Rules of runtime/README.md's table: none (the counters are
// what the "SQE cost" rule's counts are read from).
#include "model_internal.h"

namespace strata_cpu {

CoreCounters g_ctr[STRATA_MAX_CORES];
std::atomic<int> g_max_cores{0};

namespace {

struct TraceSpan {
  double t0, t1;
  int tid;
  std::string name, cat, args;  // args: a JSON object body (may be empty)
};
}  // namespace

std::atomic<bool> g_trace{false};
namespace {

std::mutex g_trace_mu;
std::vector<TraceSpan> g_trace_spans;
}  // namespace

void TraceAdd(int tid, double t0, double t1, std::string name, const char* cat, std::string args) {
  std::lock_guard<std::mutex> lk(g_trace_mu);
  g_trace_spans.push_back(TraceSpan{t0, t1, tid, std::move(name), cat, std::move(args)});
}

// Cost accounting (strata_cpu_costs_enable): each core's slots of the last launch, published when
// it returns, and the launch's own.
std::atomic<bool> g_costs{false};
std::atomic<uint64_t> g_engine_ns[STRATA_MAX_CORES];
namespace {
std::mutex g_costs_mu;
double g_core_costs[STRATA_MAX_CORES][STRATA_NUM_COSTS] = {};
double g_launch_costs[STRATA_NUM_LCOSTS] = {};
}  // namespace

void CostsCoreDone(const CoreState& c) {
  std::lock_guard<std::mutex> lk(g_costs_mu);
  for (int k = 0; k < STRATA_NUM_COSTS; ++k) g_core_costs[c.idx][k] = c.cost[k];
}
void CostsLaunch(int slot, double v) {
  std::lock_guard<std::mutex> lk(g_costs_mu);
  g_launch_costs[slot] = v;
}

void TraceStage(CoreState* c, int line) {  // closes the open stage span, opens one for `line`
  double now = Now();
  if (c->trace_line > 0)
    TraceAdd(c->idx, c->trace_line_t0, now, Sprintf("strata:%d", c->trace_line), "stage");
  c->trace_line = line;
  c->trace_line_t0 = now;
}

}  // namespace strata_cpu


using namespace strata_cpu;

extern "C" {

STRATA_EXPORT void strata_cpu_set_timeout(double seconds) { CurPool().timeout.store(seconds); }

STRATA_EXPORT int strata_cpu_set_aiv_cores(int n) {
  if (n < 1 || n > STRATA_SOC_MAX_AIV)
    return Error(Sprintf("strata_cpu_set_aiv_cores(%d): outside [1, %d] (A2/A3 SoCs have 40 or 48 vector cores)",
                         n, STRATA_SOC_MAX_AIV));
  CurPool().aiv_cores.store(n);
  return 0;
}

STRATA_EXPORT void strata_cpu_reset_counters(void) {
  for (auto& core : g_ctr)
    for (auto& c : core.v) c.store(0);
  g_max_cores.store(0);
}

STRATA_EXPORT int strata_cpu_read_counters(uint64_t* out, int max_cores) {
  int n = std::min(std::max(max_cores, 0), int(STRATA_MAX_CORES));
  for (int i = 0; out && i < n; ++i)
    for (int k = 0; k < STRATA_NUM_CTRS; ++k) out[i * STRATA_NUM_CTRS + k] = g_ctr[i].v[k].load();
  return g_max_cores.load();
}

STRATA_EXPORT void strata_cpu_trace_enable(int on) { g_trace.store(on != 0); }

STRATA_EXPORT void strata_cpu_costs_enable(int on) { g_costs.store(on != 0); }

STRATA_EXPORT int strata_cpu_read_costs(double* out, int max_cores, double* launch) {
  std::lock_guard<std::mutex> lk(g_costs_mu);
  const int blocks = int(g_launch_costs[STRATA_LCOST_BLOCKS]);
  const int n = std::min(std::max(max_cores, 0), int(STRATA_MAX_CORES));
  for (int i = 0; out && i < n; ++i) {
    for (int k = 0; k < STRATA_NUM_COSTS; ++k) out[i * STRATA_NUM_COSTS + k] = g_core_costs[i][k];
    out[i * STRATA_NUM_COSTS + STRATA_COST_SDMA_ENGINE] = double(g_engine_ns[i].load()) * 1e-9;
  }
  for (int k = 0; launch && k < STRATA_NUM_LCOSTS; ++k) launch[k] = g_launch_costs[k];
  return blocks;
}

STRATA_EXPORT int strata_cpu_trace_write(const char* path) {
  std::vector<TraceSpan> spans;
  {
    std::lock_guard<std::mutex> lk(g_trace_mu);
    spans.swap(g_trace_spans);
  }
  FILE* f = fopen(path, "a");
  if (!f) return Error(Sprintf("strata_cpu_trace_write: cannot open %s: %s", path, strerror(errno)));
  int pid = CurPool().inited ? CurPool().rank : 0;
  for (const TraceSpan& s : spans)
    fprintf(f,
            "{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"name\": \"%s\", "
            "\"cat\": \"%s\", \"args\": {%s}}\n",
            pid, s.tid, s.t0 * 1e6, (s.t1 - s.t0) * 1e6, s.name.c_str(), s.cat.c_str(), s.args.c_str());
  bool ok = fflush(f) == 0;
  fclose(f);
  return ok ? 0 : Error(Sprintf("strata_cpu_trace_write: cannot write %s", path));
}

}  // extern "C"
