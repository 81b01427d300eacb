"""Benchmarks of meanfield against reference implementations (NumPy, plain JAX, PyTorch CPU).

Run ``python -m benchmarks`` (``--quick`` for a smoke run); it writes ``BENCHMARKS.md``.
Needs the ``bench`` extra (``torch``). Benchmarks are never tests: nothing here asserts a time.
"""
