"""What a foreign CUDA context's work costs GPU-bound trainers under time-slicing: run this next
to `batchcast bench --peers synthetic` (RESULTS.md, "Where the nvJPEG path's last 9 % goes").
Patterns, repeated until killed:
  isolated RATE: one tiny kernel every 1/RATE s
  burst RATE K: every 1/RATE s, K tiny kernels back to back
  trickle RATE K GAPUS: every 1/RATE s, K tiny kernels, GAPUS microseconds apart (CPU spin)"""
import sys, time, torch
mode, rate = sys.argv[1], float(sys.argv[2])
k = int(sys.argv[3]) if len(sys.argv) > 3 else 1
gap = float(sys.argv[4]) * 1e-6 if len(sys.argv) > 4 else 0.0
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
period, t = 1.0 / rate, time.perf_counter()
print("noise", sys.argv[1:], flush=True)
while True:
    for i in range(k):
        x.add_(1)
        if gap:
            u = time.perf_counter() + gap
            while time.perf_counter() < u: pass
    torch.cuda.synchronize()
    t += period
    d = t - time.perf_counter()
    if d > 0: time.sleep(d)
    else: t = time.perf_counter()
