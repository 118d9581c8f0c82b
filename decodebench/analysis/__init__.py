"""Reading a saved ``.mlpackage`` without running it: the op histogram, the bytes one decoded
token moves (``traffic``), the redundant copies (``copies``), and the diff of two builds.

``analyze`` reads programs through ``decodebench.formats.coreml.graph``; ``diff`` works on stored analyses
(``decodebench.contracts.analysis``) and needs nothing heavier than pydantic, so the server can
use it. This face imports nothing, so importing one light module does not pull in the others.
"""
