"""Tracing: tracer values (values.py), recording a call into a Graph (record.py), one
jitted call traced into a TracedCall (call.py; the records it hands the runtime:
records.py), Python state the call reads (pystate.py; the line that changed it, for a
warning: sites.py), argument/result trees (pytree.py),
shape-only evaluation (abstract.py) and the traced backward (backward.py)."""
