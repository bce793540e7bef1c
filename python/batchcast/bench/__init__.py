"""The collocated benchmark behind `batchcast bench` (collocated.py drives trainer.py
processes); the other benchmarks live in the repository's bench/ folder."""
