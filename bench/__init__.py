"""
Benchmarks and the stress run: C{python -m bench} (or C{bench/run}).

Each module measures one thing against a baseline in the same run; the
runner writes every table to C{docs/benchmarks.md}.  C{python -m bench
stress} runs the long reliability checks that are too slow for the trial
suite.
"""
