"""The JIT at run time: the decorator and dispatch (jitted.py), cache keys
(signature.py), compiled variants and their runners (variant.py), and the checks of a
variant against eager (checking.py)."""
