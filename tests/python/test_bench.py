"""The collocated benchmark (`batchcast bench`) runs end to end in its quick mode: real server,
real trainer processes with their own DataLoaders, real metrics. Figures are not asserted
(speed is proven in bench/, not in tests); their presence and consistency are."""

import json
import subprocess


def test_quick_bench_produces_results(tmp_path, batchcast_cli):
    out = tmp_path / "bench"
    proc = subprocess.run([batchcast_cli, "bench", "--quick", "--out", str(out),
                           "--trainers", "2", "--models", "none"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    (row,) = results["rows"]
    assert row["n"] == 2
    for mode in ("baseline", "shared"):
        fig = row[mode]
        assert fig["samples"] == 2 * 3 * 8  # 2 trainers x 3 steps x batch 8, after warmup
        assert fig["cpu_core_s"] > 0
        assert fig["cpu_core_s_per_sample"] == fig["cpu_core_s"] / fig["samples"]
    assert (out / "results.png").stat().st_size > 0
    assert "| 2 | none |" in (out / "results.md").read_text()
    assert "CPU saved" in proc.stdout
