"""A heartbeat load generator: thousands of simulated workers in one process, speaking the
public protocol as agents do (docs/benchmarks.md, "The load generator"): the workers
(:mod:`~ops.bench.loadgen.generator`), their one Worker endpoint
(:mod:`~ops.bench.loadgen.service`), and the process ``python -m ops.bench.loadgen``
(:mod:`~ops.bench.loadgen.__main__`)."""
