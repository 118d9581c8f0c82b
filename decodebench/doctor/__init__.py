"""The doctor: diagnose a Core ML package's fp16 headroom, repair the normalisations that
overflow, prove the repaired package decodes the reference's tokens, and list the bytes per
token a build wastes (docs/doctor.md).

``doctor`` runs the whole examination, ``headroom`` measures each op's fp16 margin, ``repair``
applies the rewrites and keeps those ``proof`` shows to help (``repair_text`` words it),
``checkpoint`` reads the source checkpoint, ``waste`` lists the avoidable traffic. The format's own passes they call live in ``decodebench.formats.coreml``.

Nothing is imported here: the doctor needs coremltools and the CLI imports it lazily.
"""
