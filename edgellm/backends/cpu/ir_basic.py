"""IR helpers without Numba (tier_ir.py and tiers.py load before Numba is imported; ir_util re-exports)."""

from __future__ import annotations

from llvmlite import ir

_I32 = ir.IntType(32)


def splat(b: ir.IRBuilder, v: ir.Value, vec_t: ir.VectorType) -> ir.Value:
    """A vector of vec_t with every lane = v."""
    one = b.insert_element(ir.Constant(vec_t, ir.Undefined), v, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, vec_t.count), [0] * vec_t.count)
    return b.shuffle_vector(one, ir.Constant(vec_t, ir.Undefined), mask)


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The module's function `name` (an LLVM intrinsic or one of ours), declared on first use."""
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name)
