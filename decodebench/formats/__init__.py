"""Model formats: everything that speaks one format's SDK lives in that format's own folder.

``coreml/`` is Core ML (``.mlpackage`` ML programs): converting a transformers model with
coremltools, quantizing, reading the graph, the reference interpreter that runs a program on
Linux, decode sessions and verify, the GQA fold and the converter workarounds. Only modules under
``decodebench/formats/coreml/`` import coremltools; ``tests/test_architecture.py`` holds that rule.

The rooms above (analysis, building, doctor, commands) reach a format through its folder's
modules; docs/architecture.md describes what a second format adds.

Nothing is imported here: format SDKs are heavy and the CLI imports these modules lazily.
"""
