/* A stand-in for libnvidia-ml.so.1 with two GPUs and fixed readings, so the collector's NVML
 * path (dlopen, symbol lookup, columns, summary) is tested on machines without a GPU. */
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
