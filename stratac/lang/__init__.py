"""The language: .strata text -> syntax tree -> checked program -> schedule IR.

In: a source file (`frontend.load_source`). Out: the schedules of that file as IR
(`frontend.schedules`), or a StrataError whose diagnostics point at file:line:col. `syntax` parses
with the lark grammar dsl/strata.lark into the frozen syntax tree of `ast`; `sema` checks names,
types, shapes, engines and contracts and lowers the tree to stratac.ir.
"""
