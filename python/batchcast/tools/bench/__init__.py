"""The collocated benchmark behind `batchcast bench` (the repository's bench/ folder holds the
other benchmarks and the results):
  collocated.py  the command: plans, regimes, cores sweep, data-only anchor, results files;
  runner.py      one measured run: N trainers of one peer over a shared window, its probes;
  trainer.py     one trainer process (bf16 + channels_last or fp32), the window protocol;
  sources.py     the peers' data paths inside a trainer (synthetic, DataLoader, GPU decode,
                 batchcast, DALI);
  probes.py      NVML energy, CPU time of the process tree, machine description;
  report.py      Markdown tables and the plot from results.json."""
