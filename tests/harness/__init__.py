"""What every test directory shares: the pytest hooks that spread tests over workers, the run's report."""
