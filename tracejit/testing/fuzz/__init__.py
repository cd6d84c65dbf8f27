"""Differential fuzzing, jit vs eager: programs.py generates DeZero-style programs,
harness.py runs one eagerly and jitted and compares call by call, cli.py runs many in
worker processes (`python -m tracejit.testing.fuzz --help`)."""
