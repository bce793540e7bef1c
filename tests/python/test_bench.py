"""The collocated benchmark (`batchcast bench`) runs end to end in its quick mode: real server,
real trainer processes with their own DataLoaders, real window protocol and probes. Figures are
not asserted (speed is proven in bench/, not in tests); their presence and the keys the report
reads are. GPU peers say why they skipped on a machine without CUDA, and run where it exists."""

import json
import subprocess

import pytest
import torch

CPU_PEERS = ("synthetic", "dataloader", "batchcast-cpu")
GPU_PEERS = ("gpu-decode", "batchcast-nvjpeg", "batchcast-mixed")


def run_quick(tmp_path, batchcast_cli, *extra):
    out = tmp_path / "bench"
    proc = subprocess.run([batchcast_cli, "bench", "--quick", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


def assert_figures(fig, n):
    assert fig["samples_per_s"] > 0, fig
    assert len(fig["per_trainer_samples_per_s"]) == n
    assert 0 <= fig["wait_fraction"] <= 1
    assert fig["cpu_cores"] > 0 and fig["data_cpu_cores"] >= 0
    assert "joules_per_sample" in fig and "gpu_watts" in fig


def test_quick_bench_produces_results(tmp_path, batchcast_cli):
    out, results = run_quick(tmp_path, batchcast_cli)
    (regime,) = results["regimes"]
    assert (regime["model"], regime["image_size"], regime["n"]) == ("small_cnn", 64, 2)
    for peer in CPU_PEERS:
        assert_figures(regime["runs"][peer], 2)
    if not torch.cuda.is_available():
        for peer in (*GPU_PEERS, "dali"):
            assert regime["runs"][peer]["skipped"] == "needs a GPU (--device cuda)"
    # the data side had one core (the quick plan pins it, leaving the other to the trainers)
    assert all(regime["runs"][peer]["cores"] == 1 for peer in CPU_PEERS)
    assert "collocation_mode" in results["meta"]
    text = (out / "results.md").read_text()
    assert "#### small_cnn, 64 px, N = 2" in text and "| synthetic |" in text
    assert (out / "results.png").stat().st_size > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU peers need CUDA")
def test_quick_bench_gpu_peers(tmp_path, batchcast_cli):
    _, results = run_quick(tmp_path, batchcast_cli, "--device", "cuda", "--peers",
                           ",".join(GPU_PEERS))
    for peer in GPU_PEERS:
        assert_figures(results["regimes"][0]["runs"][peer], 2)


def fake_results():
    def fig(peer, rate, cores=16, n=4):
        return {"peer": peer, "model": "resnet18", "image_size": 224, "n": n, "cores": cores,
                "workers": 4, "samples_per_s": rate, "per_trainer_samples_per_s": [rate / n] * n,
                "wait_fraction": 0.1, "cpu_cores": 3.0, "data_cpu_cores": 2.0,
                "gpu_watts": 600.0, "joules_per_sample": 600.0 / rate}
    regime = {"model": "resnet18", "image_size": 224, "n": 4,
              "runs": {"synthetic": fig("synthetic", 1000), "dataloader": fig("dataloader", 500),
                       "dali": {"peer": "dali", "skipped": "not installed"}}}
    sweep = {"model": "resnet18", "image_size": 224, "n": 4, "runs": [
        fig("batchcast-nvjpeg", 900, 1), fig("batchcast-nvjpeg", 960, 2),
        fig("batchcast-nvjpeg", 990, 4), fig("dataloader", 100, 1), fig("dataloader", 400, 4),
        {"peer": "dataloader", "cores": 2, "error": "a trainer failed"}]}
    anchor = {"runs": {"batchcast-nvjpeg": fig("batchcast-nvjpeg", 20000, n=1)},
              "engine": ["| nvJPEG (hardware backend), batch 128, same files | 9000 images/s |"]}
    meta = {"cpu": "cpu", "cores": 16, "gpu": "H100", "python": "3.12", "torch": "2", "fp32": False,
            "torchvision": "0", "collocation_mode": None, "batch_size": 128, "seconds": 4,
            "warmup": 5, "settle": 1}
    return {"meta": meta, "regimes": [regime], "sweep": sweep, "anchor": anchor}


def test_report_finds_fewest_cores_and_writes_every_table(tmp_path):
    from batchcast.tools.bench import report
    results = fake_results()
    # 95 % of the 1000 samples/s ceiling: nvJPEG gets there at 2 cores, the DataLoaders never
    assert report.fewest_cores(results["sweep"]["runs"], 1000) == {"batchcast-nvjpeg": 2,
                                                                   "dataloader": None}
    text = report.markdown(results)
    assert "| dataloader | 500 | 50 % |" in text
    assert "| dali | not installed |" in text
    assert "| batchcast-nvjpeg | 900 (90 %) | 960 (96 %) | 990 (99 %) | 2 |" in text
    assert "9000 images/s" in text
    report.plot(results, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 0
