// cupti_trace: a CUDA injection library that shows what a process runs on the GPU, for machines
// without nsys (the GPU machine). Every kernel, memcpy and memset of each CUDA process started
// with CUDA_INJECTION64_PATH=<build>/bench/libcupti_trace.so and CUPTI_TRACE_DIR=DIR is appended,
// as CSV, to DIR/trace.<pid>.<command>.csv (flushed every 200 ms, so a killed process loses
// little); CUPTI_TRACE_ONLY=NAME traces only processes of that command name (e.g. batchcast).
// Columns: kind (K kernel, M memcpy, S memset),start_ns,end_ns,device,context,stream,
// name or copy kind (CUpti_ActivityMemcpyKind),grid size or bytes. bench/trace_summary.py reads
// them. Used for RESULTS.md, "Where the nvJPEG path's last 9 % goes".
#include <cupti.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

static FILE* g_out = nullptr;
static std::mutex g_mu;

static void CUPTIAPI request(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

static void CUPTIAPI complete(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lk(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (!g_out) continue;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
        std::string name = k->name ? k->name : "?";
        for (char& c : name)
          if (c == ',') c = ';';
        fprintf(g_out, "K,%llu,%llu,%u,%u,%u,%s,%d\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->deviceId, k->contextId, k->streamId,
                name.substr(0, 120).c_str(), k->gridX * k->gridY * k->gridZ);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
        fprintf(g_out, "M,%llu,%llu,%u,%u,%u,copy%u,%llu\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->deviceId, m->contextId, m->streamId,
                (unsigned)m->copyKind, (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(record);
        fprintf(g_out, "S,%llu,%llu,%u,%u,%u,memset,%llu\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->deviceId, m->contextId, m->streamId,
                (unsigned long long)m->bytes);
        break;
      }
      default:
        break;
    }
  }
  if (g_out) fflush(g_out);
  free(buffer);
}

static void at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_out) fclose(g_out);
  g_out = nullptr;
}

extern "C" int InitializeInjection(void) {
  const char* dir = getenv("CUPTI_TRACE_DIR");
  if (!dir) return 1;
  char cmd[256] = {0};
  FILE* c = fopen("/proc/self/comm", "r");
  if (c) {
    if (fgets(cmd, sizeof cmd, c)) cmd[strcspn(cmd, "\n")] = 0;
    fclose(c);
  }
  const char* only = getenv("CUPTI_TRACE_ONLY");  // trace only processes of this name
  if (only && strcmp(only, cmd) != 0) return 1;
  std::string path = std::string(dir) + "/trace." + std::to_string(getpid()) + "." + cmd + ".csv";
  g_out = fopen(path.c_str(), "w");
  cuptiActivityRegisterCallbacks(request, complete);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityFlushPeriod(200);
  atexit(at_exit);
  return 1;
}
