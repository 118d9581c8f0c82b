"""Core ML ML programs on Linux: run them (reference interpreter), compare them, fold GQA.

- :mod:`decodebench.mil.interpreter` runs a program in NumPy (``ops`` holds the kernels);
- :mod:`decodebench.mil.verify` decodes with two programs and compares tokens and logits,
  :mod:`decodebench.mil.inputs` works out which input is which; a decode loop
  (:mod:`decodebench.mil.session`) holds the KV cache as the program's states, or, for a cache
  passed in and out as inputs and outputs, as arrays (:mod:`decodebench.mil.cache_io`);
- :mod:`decodebench.mil.fold` is the GQA fold graph pass; importing it registers
  ``decodebench::fold_gqa`` with coremltools, :mod:`decodebench.mil.fold_package` applies it to
  a saved ``.mlpackage``;
- :mod:`decodebench.mil.widen` makes a program its own fp32 reference, :mod:`decodebench.mil.headroom`
  measures fp16 headroom per op, named by layer and role (:mod:`decodebench.mil.anatomy`);
  :mod:`decodebench.mil.norm_repair` rewrites the normalisations :mod:`decodebench.mil.norms`
  finds overflow-safe, :mod:`decodebench.mil.repair` applies and proves the repairs, and
  :mod:`decodebench.mil.waste` lists the avoidable bytes per token (docs/doctor.md);
- :mod:`decodebench.mil.hf` converts a transformers causal LM's decode step with a static cache,
  :mod:`decodebench.mil.compat` the converter workarounds that needs.

Nothing is imported here: coremltools is heavy and the CLI imports these modules lazily.
"""
