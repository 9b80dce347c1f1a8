"""kvtier's benchmarks: each reports ratios against a bound measured in the same run."""
