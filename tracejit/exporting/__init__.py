"""Export: a traced graph leaves Python (README, "Export").

tj.export(f, *args, dynamic=...) -> Exported; Exported.to_onnx(path) (the onnx extra),
Exported.save(path) and tj.load(path) (a file that runs without the user's source).
"""
from tracejit.exporting.exported import FORMAT_VERSION, Exported, ExportError, export
from tracejit.exporting.saved import load

__all__ = ["FORMAT_VERSION", "Exported", "ExportError", "export", "load"]
