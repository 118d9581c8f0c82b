"""Core AI (``.aimodel`` assets), Apple's successor to Core ML for LLMs (iOS and macOS 27).

Converting a decoder with coreai-torch (:mod:`.convert`), reading an asset's program
(:mod:`.program`) into the neutral graph the analyses consume (:mod:`.graph`), the project's
own engine that runs a program on Linux fast enough for proofs (:mod:`.engine`), and Apple's
runtime as the arbiter of what a program means (:mod:`.runtime`). Only modules in this folder
import ``coreai`` or ``coreai_torch``.
"""
