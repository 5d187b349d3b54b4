"""The schedule IR and the stages that work on it.

In: the IR sema lowers a checked program to (`nodes`: schedules of stages, copies, reductions,
routing, syncs; `expr`: integer expressions symbolic in rank, world and the size symbols).
Out: per-rank event lists for one concrete world and size (`instantiate`, read by the verifier) and
the IR after the pass pipeline (`passes`: flag epochs, engine placement, UB tiling), read by codegen.

Every stage says `ir.Copy`, `ir.DType`, `ir.dump(...)`: the node, expression and printer names are
re-exported here. This package imports nothing above it.
"""

from stratac.ir.expr import (
                             Bin,
                             BinKind,
                             Const,
                             IExpr,
                             Sel,
                             Var,
                             add,
                             affine,
                             bare,
                             c_source,
                             log2,
                             nonnegative,
                             py_source,
                             simplify,
                             size_scale,
                             split_part,
                             substitute,
)
from stratac.ir.nodes import (
                             ELEM,
                             MASK_MAX_WORLD,
                             MASKED_KINDS,
                             ROUTE_OPERANDS,
                             Accumulate,
                             Await,
                             Barrier,
                             Buffer,
                             CallSite,
                             Contract,
                             ContractKind,
                             Copy,
                             Domain,
                             DType,
                             Engine,
                             Flag,
                             If,
                             KernelPlan,
                             Local,
                             Loop,
                             Node,
                             Op,
                             OpParam,
                             Plan,
                             Reduce,
                             ReduceList,
                             ReduceOp,
                             Region,
                             Requirement,
                             Route,
                             RouteKind,
                             Scalar,
                             ScalarKind,
                             Schedule,
                             Set,
                             Signal,
                             SizeRule,
                             Stage,
                             Team,
                             WINDOW_ROW_ALIGN,
                             Wait,
                             size_rules,
                             sources,
                             takes_mask,
                             padded_row,
                             unmet_requirement,
                             elem_env,
                             elem_sizes,
)
from stratac.ir.printer import dump

__all__ = ["Bin", "BinKind", "Const", "IExpr", "Sel", "Var", "add", "bare", "c_source", "log2",
           "nonnegative", "py_source", "Requirement", "unmet_requirement", "MASK_MAX_WORLD", "ELEM", "elem_env", "elem_sizes", "MASKED_KINDS", "takes_mask",
           "affine", "simplify", "size_scale", "split_part", "substitute", "ROUTE_OPERANDS", "Accumulate", "Await", "Barrier",
           "Buffer", "CallSite", "Contract", "ContractKind", "Copy", "Domain", "DType", "Engine", "Flag", "If",
           "KernelPlan", "Local", "Loop", "Node", "Op", "OpParam", "Plan", "Reduce", "ReduceList", "ReduceOp", "Region",
           "Route", "RouteKind", "sources", "Scalar", "ScalarKind", "Schedule", "Set", "Signal", "SizeRule", "Stage",
           "Team", "Wait", "size_rules", "dump", "WINDOW_ROW_ALIGN", "padded_row"]
