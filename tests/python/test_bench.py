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


def assert_figures(fig, trainers):
    assert fig["samples_per_s"] > 0, fig
    assert [(t["model"], t["image_size"]) for t in fig["per_trainer"]] == trainers
    assert all(t["samples_per_s"] > 0 for t in fig["per_trainer"]), fig["per_trainer"]
    assert 0 <= fig["wait_fraction"] <= 1
    assert fig["cpu_cores"] > 0 and fig["data_cpu_cores"] >= 0
    assert "joules_per_sample" in fig and "gpu_watts" in fig


def test_quick_bench_produces_results(tmp_path, batchcast_cli):
    out, results = run_quick(tmp_path, batchcast_cli)
    (regime,) = results["regimes"]
    assert (regime["trainers"], regime["n"]) == ([["small_cnn", 64]] * 2, 2)
    for peer in CPU_PEERS:
        assert_figures(regime["runs"][peer], [("small_cnn", 64)] * 2)
    if not torch.cuda.is_available():
        for peer in (*GPU_PEERS, "dali"):
            assert regime["runs"][peer]["skipped"] == "needs a GPU (--device cuda)"
    # the data side had one core (the quick plan pins it, leaving the other to the trainers)
    assert all(regime["runs"][peer]["cores"] == 1 for peer in CPU_PEERS)
    assert "collocation_mode" in results["meta"]
    text = (out / "results.md").read_text()
    assert "#### small_cnn, 64 px, N = 2" in text and "| synthetic |" in text
    assert "| trainer |" not in text  # one kind of trainer: no per-trainer table
    assert (out / "results.png").stat().st_size > 0
    # each finished run also on its own, written as it ended
    for peer in CPU_PEERS:
        run = json.loads((out / "runs" / f"small_cnn-64-N2-{peer}.json").read_text())
        assert run["samples_per_s"] == regime["runs"][peer]["samples_per_s"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU peers need CUDA")
def test_quick_bench_gpu_peers(tmp_path, batchcast_cli):
    _, results = run_quick(tmp_path, batchcast_cli, "--device", "cuda", "--peers",
                           ",".join(GPU_PEERS))
    for peer in GPU_PEERS:
        assert_figures(results["regimes"][0]["runs"][peer], [("small_cnn", 64)] * 2)


def test_quick_mixed_regime_gives_each_trainer_its_model_and_size(tmp_path, batchcast_cli):
    # Two trainers at 64 and 48 px: batchcast serves 48 as a view of the 64 px server.
    trainers = [("small_cnn", 64), ("small_cnn", 48)]
    out, results = run_quick(tmp_path, batchcast_cli, "--regimes", "small_cnn:64+small_cnn:48",
                             "--peers", "synthetic,batchcast-cpu,dataloader,batchcast-nvjpeg")
    (regime,) = results["regimes"]
    assert (regime["trainers"], regime["n"]) == ([list(t) for t in trainers], 2)
    for peer in CPU_PEERS:
        fig = regime["runs"][peer]
        assert_figures(fig, trainers)
        # each trainer's share of the same trainer's synthetic rate
        assert all(t["of_ceiling"] > 0 for t in fig["per_trainer"]), fig["per_trainer"]
    if not torch.cuda.is_available():
        skipped = regime["runs"]["batchcast-nvjpeg"]["skipped"]
        assert skipped.startswith("needs a GPU"), skipped
    log = (out / "logs" / "small_cnn-64+small_cnn-48-batchcast-cpu" / "server0.log").read_text()
    # one view besides the server's own, a 48 px float32 batch of 8 per slot, read by trainer 1
    assert "view 1: " in log and "view 2:" not in log, log[-3000:]
    assert f" x {48 * 48 * 3 * 4 * 8 // 1024}." in log, log[-3000:]  # KiB with one decimal
    assert "view 1, starts at" in log, log[-3000:]
    assert regime["runs"]["batchcast-cpu"]["pool_mib"] > 0  # the pool's and the view's slots
    text = (out / "results.md").read_text()
    assert "#### small_cnn:64 + small_cnn:48, N = 2" in text
    table = text[text.index("| trainer |"):].splitlines()
    assert table[0] == "| trainer | synthetic | batchcast-cpu | dataloader |"
    assert table[2].startswith("| 0: small_cnn:64 | ") and table[3].startswith(
        "| 1: small_cnn:48 | "), table


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU pools need CUDA")
def test_quick_mixed_regime_on_a_gpu_pool(tmp_path, batchcast_cli):
    trainers = [("small_cnn", 64), ("small_cnn", 48)]
    _, results = run_quick(tmp_path, batchcast_cli, "--device", "cuda", "--regimes",
                           "small_cnn:64+small_cnn:48", "--peers",
                           "batchcast-cpu,gpu-decode,batchcast-nvjpeg,batchcast-mixed")
    runs = results["regimes"][0]["runs"]
    # the GPU decoders serve the 48 px trainer as a view too
    for peer in ("batchcast-cpu", "gpu-decode", "batchcast-nvjpeg", "batchcast-mixed"):
        assert_figures(runs[peer], trainers)


def test_regimes_parse_both_forms():
    from batchcast.tools.bench.collocated import parse, regimes
    args = parse(["--quick", "--regimes", "resnet18:224:2,resnet50:192+small_cnn:64"])
    assert regimes(args) == [[("resnet18", 224)] * 2, [("resnet50", 192), ("small_cnn", 64)]]
    with pytest.raises(SystemExit, match="use MODEL:SIZE:N"):
        regimes(parse(["--quick", "--regimes", "resnet18:224+resnet50"]))


def fake_results():
    def fig(peer, rate, cores=16, n=4):
        return {"peer": peer, "n": n, "cores": cores,
                "workers": 4, "samples_per_s": rate, "per_trainer": [
                    {"model": "resnet18", "image_size": 224, "samples_per_s": rate / n,
                     "of_ceiling": rate / 1000}] * n,
                "wait_fraction": 0.1, "cpu_cores": 3.0, "data_cpu_cores": 2.0,
                "gpu_watts": 600.0, "joules_per_sample": 600.0 / rate}
    regime = {"trainers": [["resnet18", 224]] * 4, "n": 4,
              "runs": {"synthetic": fig("synthetic", 1000), "dataloader": fig("dataloader", 500),
                       "dali": {"peer": "dali", "skipped": "not installed"}}}
    sweep = {"trainers": [["resnet18", 224]] * 4, "n": 4, "runs": [
        fig("batchcast-nvjpeg", 900, 1), fig("batchcast-nvjpeg", 960, 2),
        fig("batchcast-nvjpeg", 990, 4), fig("dataloader", 100, 1), fig("dataloader", 400, 4),
        {"peer": "dataloader", "cores": 2, "error": "a trainer failed"}]}
    anchor = {"runs": {"batchcast-nvjpeg": fig("batchcast-nvjpeg", 20000, n=1)},
              "engine": ["| nvJPEG (hardware backend), batch 128, same files | 9000 images/s |"]}
    meta = {"cpu": "cpu", "cores": 16, "gpu": "H100", "python": "3.12", "torch": "2", "fp32": False,
            "torchvision": "0", "collocation_mode": None, "batch_size": 128, "seconds": 4,
            "warmup": 5, "settle": 1}
    mixed = {"trainers": [["resnet18", 224], ["resnet50", 192]], "n": 2, "runs": {
        "synthetic": dict(fig("synthetic", 300, n=2), per_trainer=[
            {"model": "resnet18", "image_size": 224, "samples_per_s": 200, "of_ceiling": 1.0},
            {"model": "resnet50", "image_size": 192, "samples_per_s": 100, "of_ceiling": 1.0}]),
        "batchcast-cpu": dict(fig("batchcast-cpu", 290, n=2), per_trainer=[
            {"model": "resnet18", "image_size": 224, "samples_per_s": 194, "of_ceiling": 0.97},
            {"model": "resnet50", "image_size": 192, "samples_per_s": 96, "of_ceiling": 0.96}]),
        "batchcast-nvjpeg": {"peer": "batchcast-nvjpeg", "skipped": "needs a GPU (--device cuda)"}}}
    return {"meta": meta, "regimes": [regime, mixed], "sweep": sweep, "anchor": anchor}


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
    # the mixed regime: its title, and a row per trainer of every peer that ran
    assert "#### resnet18:224 + resnet50:192, N = 2" in text
    assert "| trainer | synthetic | batchcast-cpu |" in text
    assert "| 0: resnet18:224 | 200 (100 %) | 194 (97 %) |" in text
    assert "| 1: resnet50:192 | 100 (100 %) | 96 (96 %) |" in text
    assert text.count("| trainer |") == 1  # none for the regime of one kind of trainer
    report.plot(results, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 0
