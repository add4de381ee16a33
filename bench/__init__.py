"""Hardware-portable gather benchmarks: xgather beside its peers, against the copy roof."""
