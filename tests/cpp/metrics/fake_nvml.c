/* A stand-in for libnvidia-ml.so.1 with two GPUs and fixed readings, so the collector's NVML
 * path (dlopen, symbol lookup, columns, summary) is tested on machines without a GPU.
 * GPU 0 has GPM (fixed activity figures) and GPU 1 has not; both count energy (+100 J per
 * reading); the calling process is listed on GPU 0 (1000 MB, 42 % SM). FAKE_NVML_MIG=1 turns
 * MIG mode on, FAKE_NVML_MPS=1 lists the caller as an MPS client instead. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef struct {
  unsigned int gpu, memory;
} util_t;
typedef struct {
  unsigned long long total, free, used;
} mem_t;
typedef void* dev_t_;

static int devices[2];

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* n) {
  *n = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, dev_t_* d) {
  if (i >= 2) return 2;
  *d = &devices[i];
  return 0;
}
int nvmlDeviceGetName(dev_t_ d, char* name, unsigned int len) {
  const char* s = d == &devices[0] ? "Fake GPU 0" : "Fake GPU 1";
  unsigned int i = 0;
  for (; s[i] && i + 1 < len; ++i) name[i] = s[i];
  name[i] = 0;
  return 0;
}
int nvmlDeviceGetUtilizationRates(dev_t_ d, util_t* u) {
  u->gpu = d == &devices[0] ? 40 : 80;
  u->memory = 10;
  return 0;
}
int nvmlDeviceGetMemoryInfo(dev_t_ d, mem_t* m) {
  (void)d;
  m->total = 80000000000ULL;
  m->used = 20000000000ULL;
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetPowerUsage(dev_t_ d, unsigned int* mw) {
  (void)d;
  *mw = 250000;
  return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(dev_t_ d, unsigned int* mw) {
  (void)d;
  *mw = 500000;
  return 0;
}

/* Optional entry points. */
static int env_on(const char* name) {
  const char* v = getenv(name);
  return v != NULL && strcmp(v, "1") == 0;
}

int nvmlDeviceGetTotalEnergyConsumption(dev_t_ d, unsigned long long* mj) {
  static unsigned long long energy[2];
  int i = d == &devices[0] ? 0 : 1;
  energy[i] += 100000ULL;
  *mj = energy[i];
  return 0;
}

int nvmlDeviceGetMigMode(dev_t_ d, unsigned int* current, unsigned int* pending) {
  (void)d;
  *current = *pending = env_on("FAKE_NVML_MIG") ? 1 : 0;
  return 0;
}

typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gi, ci;
  unsigned long long cc;
} proc_detail_t;
typedef struct {
  unsigned int version, mode, count;
  proc_detail_t* procs;
} proc_list_t;

/* The versioned call: rejects any struct version but ProcessDetailList v1 (24 bytes | 1 << 24)
 * with NVML_ERROR_ARGUMENT_VERSION_MISMATCH, as the driver does. */
int nvmlDeviceGetRunningProcessDetailList(dev_t_ d, proc_list_t* list) {
  if (list->version != (24u | (1u << 24))) return 25;
  int listed = d == &devices[0] && list->mode == (env_on("FAKE_NVML_MPS") ? 2u : 0u);
  if (!listed) {
    list->count = 0;
    return 0;
  }
  if (list->count < 1) {
    list->count = 1;
    return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
  }
  list->count = 1;
  memset(list->procs, 0, sizeof *list->procs);
  list->procs[0].pid = (unsigned int)getpid();
  list->procs[0].used = 1000000000ULL;
  return 0;
}

typedef struct {
  unsigned int pid;
  unsigned long long ts;
  unsigned int sm, mem, enc, dec;
} util_sample_t;

int nvmlDeviceGetProcessUtilization(dev_t_ d, util_sample_t* s, unsigned int* n,
                                    unsigned long long last_seen) {
  static unsigned long long ts = 1000;
  (void)last_seen;
  if (d != &devices[0]) return 6; /* NVML_ERROR_NOT_FOUND: no sample */
  if (s == NULL || *n < 1) {
    *n = 1;
    return 7;
  }
  *n = 1;
  s[0].pid = (unsigned int)getpid();
  s[0].ts = ++ts;
  s[0].sm = 42;
  s[0].mem = s[0].enc = s[0].dec = 0;
  return 0;
}

typedef struct {
  unsigned int version, supported;
} gpm_support_t;
typedef struct {
  unsigned int id;
  int ret;
  double value;
  void* info[3];
} gpm_metric_t;
typedef struct {
  unsigned int version, count;
  void *s1, *s2;
  gpm_metric_t metrics[1];
} gpm_get_t;
static int gpm_samples;

int nvmlGpmQueryDeviceSupport(dev_t_ d, gpm_support_t* s) {
  if (s->version != 1) return 25;
  s->supported = d == &devices[0];
  return 0;
}
int nvmlGpmSampleAlloc(void** s) {
  *s = malloc(1);
  return 0;
}
int nvmlGpmSampleFree(void* s) {
  free(s);
  return 0;
}
int nvmlGpmSampleGet(dev_t_ d, void* s) {
  (void)d;
  (void)s;
  ++gpm_samples;
  return 0;
}
/* SM_UTIL 2 -> 55, SM_OCCUPANCY 3 -> 33, ANY_TENSOR 5 -> 22, DRAM_BW 10 -> 11. */
int nvmlGpmMetricsGet(gpm_get_t* g) {
  if (g->version != 1 || g->s1 == g->s2) return 25;
  for (unsigned int i = 0; i < g->count; ++i) {
    unsigned int id = g->metrics[i].id;
    g->metrics[i].ret = 0;
    g->metrics[i].value = id == 2 ? 55 : id == 3 ? 33 : id == 5 ? 22 : id == 10 ? 11 : 0;
  }
  return 0;
}
