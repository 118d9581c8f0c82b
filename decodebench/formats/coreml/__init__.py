"""Core ML: convert, quantize, read and run ML programs on Linux, compare them, fold GQA.

- :mod:`decodebench.formats.coreml.interpreter` runs a program in NumPy (``ops`` holds the kernels);
- :mod:`decodebench.formats.coreml.verify` decodes with two programs and compares tokens and logits,
  :mod:`decodebench.formats.coreml.inputs` works out which input is which; a decode loop
  (:mod:`decodebench.formats.coreml.session`) holds the KV cache as the program's states, or, for a cache
  passed in and out as inputs and outputs, as arrays (:mod:`decodebench.formats.coreml.cache_io`);
- :mod:`decodebench.formats.coreml.fold` is the GQA fold graph pass; importing it registers
  ``decodebench::fold_gqa`` with coremltools, :mod:`decodebench.formats.coreml.fold_package` applies it to
  a saved ``.mlpackage``;
- :mod:`decodebench.formats.coreml.widen` makes a program its own fp32 reference, ``anatomy``
  names ops by layer and role, ``norm_repair`` rewrites the normalisations ``norms`` finds
  overflow-safe (the doctor, :mod:`decodebench.doctor`, drives these);
- ``convert`` converts a variant for a build, ``quant`` quantizes it, ``graph`` reads a saved
  package's functions for analysis, ``hf`` and ``recipe`` convert transformers models for
  tests and benchmarks, ``compat`` registers the converter workarounds (torch-op patches) once,
  ``host_kernels`` holds the kernels the host decode driver shares with the interpreter.

Nothing is imported here: coremltools is heavy and the CLI imports these modules lazily.
"""
