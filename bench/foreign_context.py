"""What a foreign CUDA context's work costs GPU-bound trainers under time-slicing, and what they
cost it: run this next to `batchcast bench --peers synthetic` or `cuda_bench --decode DIR`
(RESULTS.md, "Where the nvJPEG path's last 9 % goes", "Who holds a GPU pool's stream back").
Patterns, repeated until killed:
  isolated RATE: one tiny kernel every 1/RATE s
  burst RATE K: every 1/RATE s, K tiny kernels back to back
  trickle RATE K GAPUS: every 1/RATE s, K tiny kernels, GAPUS microseconds apart (CPU spin)
  train MODEL: a GPU-bound trainer (torchvision MODEL, bf16 autocast, channels_last, SGD, one
    random batch of 128 at 224 px), printing its samples/s every 10 s"""
import sys, time, torch


def train(model_name: str) -> None:
    import torchvision
    model = getattr(torchvision.models, model_name)().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(128, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t, n = time.perf_counter(), 0
    while True:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(x).float().sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        n += 1
        if time.perf_counter() - t >= 10:
            torch.cuda.synchronize()
            print(f"train {model_name}: {n * 128 / (time.perf_counter() - t):.0f} samples/s",
                  flush=True)
            t, n = time.perf_counter(), 0


if sys.argv[1] == "train":
    train(sys.argv[2])
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
