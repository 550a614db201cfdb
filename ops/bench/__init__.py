"""The benchmarks (``stockade bench``: failover, pack, overload, unschedulable, scale), the load
generator they drive (:mod:`ops.bench.loadgen`) and the measure scripts
(``python -m ops.bench.measure_*``); each prints measured numbers, never asserted in tests."""
