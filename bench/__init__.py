"""conveyor's benchmarks against its peers; run with ``python -m bench``."""
