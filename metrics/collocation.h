// How GPU jobs share this machine's GPUs, detected rather than typed by hand: the value of radT's
// "Collocation" column, recorded in every run's summary and in the benchmark results.
//
//   "mig"           MIG mode is enabled on a GPU (jobs run in isolated GPU instances)
//   "mps"           an MPS control daemon serves this machine (its control socket in the pipe
//                   directory accepts connections) or NVML lists MPS client processes
//   "time-slicing"  a GPU without either: the driver's default time-slicing
//   "none"          no GPU visible through NVML
//
// MIG wins over MPS: MPS inside a MIG instance is still bounded by the instance. Contract: plain
// functions, thread-safe, no root needed, nothing changed on the machine (probing MPS opens and
// closes a connection to the control socket, as `nvidia-cuda-mps-control` does).
#pragma once

#include <string>

namespace batchcast::metrics {

class Nvml;

struct CollocationEvidence {
  bool gpu = false;          // NVML reports at least one GPU
  bool mig_enabled = false;  // nvmlDeviceGetMigMode current == enabled on some GPU
  bool mps_daemon = false;   // the MPS control socket accepts connections
  bool mps_clients = false;  // NVML's MPS running-process list is not empty
};

// The rule above, on gathered evidence (pure; unit-tested).
std::string classify_collocation(const CollocationEvidence& evidence);

// $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps (the daemon's default).
std::string mps_pipe_directory();

// True when `<pipe_dir>/control` is a Unix socket that accepts a connection.
bool mps_control_live(const std::string& pipe_dir);

// Gathers the evidence (NVML may be null: no GPU) and classifies it.
std::string detect_collocation(Nvml* nvml);

}  // namespace batchcast::metrics
