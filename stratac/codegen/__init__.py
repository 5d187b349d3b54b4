"""Code generation: the IR after the passes -> kernel.cpp, launch.cpp, CMakeLists.txt, manifest.json.

In: a verified schedule after the pass pipeline (stratac.ir.passes). Out: an `Output` (the four
files as text). `emit` turns the IR into template data; the jinja2 templates own the text; `abi`
is the one description of the kernel ABI, from which both the C launcher signature and the cffi
cdef are made.
"""

from stratac.codegen.emit import GENERATOR, Output, generate, manifest, write

__all__ = ["GENERATOR", "Output", "generate", "manifest", "write"]
