// Events between a core's pipes (SetFlag/WaitFlag on HardEvent ids, TPipe's AllocEventID,
// ReleaseEventID, FetchEventID): per core, binary flags and who holds each id (an AllocEventID, or a
// TQue for its EnQue'd and freed buffers). Also the core's current TPipe. In: the calls of
// kernel_operator.h; out: event ids, failures. Rules of runtime/README.md's table: "`WaitFlag` needs
// a prior `SetFlag`" (EventWait), "event flags are binary" (EventSet, CheckEvent), "event ids"
// (EventAlloc, EventRelease, EventFetch).
#include "model_internal.h"

namespace strata_cpu {

namespace {
const char* EventName(int e) {
  static const char* const names[] = {"MTE2_V", "V_MTE2", "MTE3_V", "V_MTE3", "V_V", "MTE3_MTE2", "MTE2_MTE3",
                                      "S_V",    "V_S",    "S_MTE2", "MTE2_S", "S_MTE3", "MTE3_S"};
  return e >= 0 && e < 13 ? names[e] : "?";
}
void CheckEvent(int event, int id, const char* api) {
  if (event < 0 || event >= kEvents) FailStr(Sprintf("%s: invalid HardEvent %d", api, event));
  if (id < 0 || id >= kEventIds)
    FailStr(Sprintf("%s<HardEvent::%s>: event id %d is outside [0, %d) (A2/A3 event ids are 0-7)", api,
                    EventName(event), id, kEventIds));
}
const char* HolderName(uint8_t h) {
  return h == kEvAlloc ? "AllocEventID" : h == kEvQueue ? "a TQue (EnQue'd or freed buffer)" : "nobody";
}
// Lowest id of `event` that nobody holds and whose flag is clear, or -1.
int FreeEventId(CoreState* c, int event) {
  for (int id = 0; id < kEventIds; ++id)
    if (c->ev_hold[event][id] == kEvFree && !c->ev_set[event][id]) return id;
  return -1;
}
[[noreturn]] void FailNoEventId(CoreState* c, int event, const char* api) {
  std::string held;
  for (int id = 0; id < kEventIds; ++id)
    held += Sprintf("%s%d: %s%s", id ? ", " : "", id, HolderName(c->ev_hold[event][id]),
                    c->ev_set[event][id] ? " (set)" : "");
  FailStr(Sprintf("%s<HardEvent::%s>: no free event id (%s); ReleaseEventID missing?", api, EventName(event),
                  held.c_str()));
}
}  // namespace

// Flags are binary (TQueSync SetFlag/WaitFlag doc: SetFlag sets the hardware flag bit to 1, WaitFlag
// blocks while it is 0 and clears it). A second SetFlag before the WaitFlag is lost, so the second
// WaitFlag waits forever: the model refuses the second SetFlag ("set-set").
STRATA_EXPORT void EventSet(int event, int id, const char* api) {
  CoreState* c = Cur(api);
  CheckEvent(event, id, api);
  if (c->ev_set[event][id])
    FailStr(Sprintf("%s<HardEvent::%s>(%d): set-set: the flag is already set and not yet waited for (held by "
                    "%s); flags are binary, so one of the two WaitFlags would wait forever on hardware (take "
                    "ids from TPipe::AllocEventID, not fixed EVENT_IDs)",
                    api, EventName(event), id, HolderName(c->ev_hold[event][id])));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  c->ev_set[event][id] = 1;
}

STRATA_EXPORT void EventWait(int event, int id, const char* api) {
  CoreState* c = Cur(api);
  CheckEvent(event, id, api);
  if (!c->ev_set[event][id])
    FailStr(Sprintf("%s<HardEvent::%s>(%d) without a matching SetFlag since the last wait (on hardware this "
                    "waits forever)",
                    api, EventName(event), id));
  c->ev_set[event][id] = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

STRATA_EXPORT int EventFetch(int event) {
  CoreState* c = Cur("FetchEventID");
  if (event < 0 || event >= kEvents) FailStr(Sprintf("FetchEventID: invalid HardEvent %d", event));
  int id = FreeEventId(c, event);
  if (id < 0) FailNoEventId(c, event, "FetchEventID");
  return id;
}

STRATA_EXPORT int EventAlloc(int event, bool by_queue, const char* api) {
  CoreState* c = Cur(api);
  if (event < 0 || event >= kEvents) FailStr(Sprintf("%s: invalid HardEvent %d", api, event));
  int id = FreeEventId(c, event);
  if (id < 0) FailNoEventId(c, event, api);
  c->ev_hold[event][id] = by_queue ? kEvQueue : kEvAlloc;
  return id;
}

STRATA_EXPORT void EventRelease(int event, int id, bool by_queue, const char* api) {
  CoreState* c = Cur(api);
  CheckEvent(event, id, api);
  uint8_t want = by_queue ? kEvQueue : kEvAlloc;
  if (c->ev_hold[event][id] != want)
    FailStr(Sprintf("%s<HardEvent::%s>(%d): the id is held by %s, not by %s", api, EventName(event), id,
                    HolderName(c->ev_hold[event][id]), HolderName(want)));
  if (c->ev_set[event][id])
    FailStr(Sprintf("%s<HardEvent::%s>(%d): released with its flag still set (WaitFlag missing; the next "
                    "holder's SetFlag would be lost)",
                    api, EventName(event), id));
  c->ev_hold[event][id] = kEvFree;
}

STRATA_EXPORT void* CurrentPipe() { return t_core ? t_core->pipe : nullptr; }
STRATA_EXPORT void SetCurrentPipe(void* pipe) {
  if (t_core) t_core->pipe = pipe;
}

}  // namespace strata_cpu
