"""The IR: values, nodes and graphs (graph.py), and the reference interpreter
(interpret.py), which runs a graph with each primitive's own NumPy forward."""
from tracejit.ir.graph import Graph, Lit, Node, Summary, Value, check

__all__ = ["Graph", "Lit", "Node", "Summary", "Value", "check"]
