"""The primitive table: every op a graph can hold, each one class.

primitive.py: the registry and the Elementwise base; elementwise.py and arrayops.py:
the primitives users reach through tracejit.functions; trace_only.py: the ops only the
tracer creates (guards, NumPy calls on traced data, user Functions).
"""
