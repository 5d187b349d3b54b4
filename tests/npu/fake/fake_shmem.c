/* A FAKE libshmem.so for tests/npu/test_fake_runtime.py: the SHMEM for Ascend host calls that
 * stratac/host/npu_comm.py makes, with the layouts of its cffi description, over ordinary host
 * memory. It records each call in a text log (fake_shmem_log) and fails on request
 * (fake_shmem_fail). Not SHMEM's code: written from the public signatures. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int32_t version; int my_pe; int n_pes; char internal[124]; } aclshmemx_uniqueid_t;
typedef struct {
  int version; int data_op_engine_type; uint32_t shm_init_timeout; uint32_t shm_create_timeout;
  uint32_t control_operation_timeout; int32_t sockFd;
} aclshmem_init_optional_attr_t;
typedef struct {
  int my_pe; int n_pes; char ip_port[64]; uint64_t local_mem_size;
  aclshmem_init_optional_attr_t option_attr; void* comm_args; uint64_t instance_id;
} aclshmemx_init_attr_t;

static char g_log[65536];
static char g_fail[64];          /* the name of the call that returns an error */
static unsigned char* g_heap;
static uint64_t g_heap_size, g_used;
static int g_init;

static void logf_(const char* fmt, long long a, long long b, long long c, long long d) {
  size_t n = strlen(g_log);
  snprintf(g_log + n, sizeof g_log - n, fmt, a, b, c, d);
}
static int fails(const char* name) { return strcmp(g_fail, name) == 0; }

const char* fake_shmem_log(void) { return g_log; }
void fake_shmem_fail(const char* name) { snprintf(g_fail, sizeof g_fail, "%s", name); }
void fake_shmem_reset(void) { g_log[0] = 0; g_fail[0] = 0; }

int aclshmemx_get_uniqueid(aclshmemx_uniqueid_t* uid) {
  logf_("get_uniqueid version=%lld\n", uid->version, 0, 0, 0);
  if (fails("aclshmemx_get_uniqueid")) return -6;
  memset(uid->internal, 0x5a, sizeof uid->internal);
  return 0;
}

int aclshmemx_set_attr_uniqueid_args(int my_pe, int n_pes, int64_t local_mem_size,
                                     aclshmemx_uniqueid_t* uid, aclshmemx_init_attr_t* attr) {
  logf_("set_attr pe=%lld n=%lld heap=%lld uid=%lld\n", my_pe, n_pes, local_mem_size,
        (unsigned char)uid->internal[0]);
  if (fails("aclshmemx_set_attr_uniqueid_args")) return -1;
  attr->my_pe = my_pe; attr->n_pes = n_pes; attr->local_mem_size = (uint64_t)local_mem_size;
  attr->comm_args = uid;
  return 0;
}

int aclshmemx_init_attr(unsigned int flags, aclshmemx_init_attr_t* attr) {
  logf_("init_attr flags=%lld engines=%lld timeout=%lld version=%lld\n", flags,
        attr->option_attr.data_op_engine_type, attr->option_attr.shm_init_timeout,
        attr->option_attr.version);
  if (fails("aclshmemx_init_attr")) return -7;
  g_heap_size = attr->local_mem_size;
  /* SHMEM's heap is mapped in 2 MiB pages: page-aligned here */
  void* heap = NULL;
  g_heap = posix_memalign(&heap, 4096, g_heap_size) == 0 ? (unsigned char*)heap : NULL;
  if (g_heap) memset(g_heap, 0, g_heap_size);
  g_used = 0;
  g_init = 1;
  return g_heap ? 0 : -4;
}

void* aclshmem_malloc(size_t size) {
  size_t n = (size + 15) / 16 * 16;   /* SHMEM's malloc aligns to 16 bytes (shmem_mgr.cpp:241-245) */
  logf_("malloc %lld\n", (long long)size, 0, 0, 0);
  if (!g_init || g_used + n > g_heap_size) return NULL;
  void* p = g_heap + g_used;
  g_used += n;
  return p;
}

/* aligned to `alignment` (a power of two): the fake bump allocator skips to the next multiple */
void* aclshmem_align(size_t alignment, size_t size) {
  logf_("align %lld %lld\n", (long long)alignment, (long long)size, 0, 0);
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) return NULL;
  uint64_t at = (g_used + alignment - 1) / alignment * alignment;
  if (!g_init || at + size > g_heap_size) return NULL;
  g_used = at + (size + 15) / 16 * 16;
  return g_heap + at;
}

void* aclshmem_calloc(size_t nmemb, size_t size) {
  logf_("calloc %lld %lld\n", (long long)nmemb, (long long)size, 0, 0);
  void* p = aclshmem_malloc(nmemb * size);
  if (p) memset(p, 0, nmemb * size);
  return p;
}

void aclshmem_free(void* ptr) { logf_("free +%lld\n", (long long)((unsigned char*)ptr - g_heap), 0, 0, 0); }

int aclshmem_finalize(void) {
  logf_("finalize\n", 0, 0, 0, 0);
  if (fails("aclshmem_finalize")) return -5;
  free(g_heap);
  g_heap = NULL;
  g_init = 0;
  return 0;
}
