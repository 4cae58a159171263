"""Small helpers shared by the kernels written as LLVM IR (vnni.py, attention.py, silu_ir.py)."""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from edgellm.backends.cpu.ir_basic import declare, splat  # noqa: F401 - re-exported

I32, I64 = ir.IntType(32), ir.IntType(64)


def switch_intrinsic(variants: dict[int, tuple[str, Callable[[ir.Module, str], ir.Function]]], n_args: int):
    """A Numba intrinsic `kernel(key, a0, ..., a{n_args-1})` (all intp) that calls the variant built for
    `key` (a `switch` in the IR; callers pass only keys in `variants`). Each variant is an IR function
    `void name(i64 x n_args)`, built into the calling module the first time a caller is compiled.
    One intrinsic per kernel family instead of an if/elif ladder over one intrinsic per variant."""

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        key, rest = args[0], list(args[1:])
        end = builder.append_basic_block("variant_end")
        sw = builder.switch(key, end)
        for k, (name, build) in variants.items():
            case = builder.append_basic_block(f"variant_{k}")
            sw.add_case(ir.Constant(key.type, k), case)
            builder.position_at_end(case)
            fn = builder.module.globals.get(name)
            builder.call(fn if fn is not None else build(builder.module, name), rest)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    sig = types.void(*([types.intp] * (n_args + 1)))
    if n_args == 4:

        @intrinsic
        def kernel4(typingctx, key, a0, a1, a2, a3):  # noqa: ANN001, ANN202
            return sig, codegen

        return kernel4
    if n_args == 7:

        @intrinsic
        def kernel7(typingctx, key, a0, a1, a2, a3, a4, a5, a6):  # noqa: ANN001, ANN202
            return sig, codegen

        return kernel7
    if n_args == 12:

        @intrinsic
        def kernel12(typingctx, key, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11):  # noqa: ANN001, ANN202
            return sig, codegen

        return kernel12
    if n_args == 15:

        @intrinsic
        def kernel15(typingctx, key, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14):  # noqa: ANN001, ANN202
            return sig, codegen

        return kernel15
    raise ValueError(f"no switch intrinsic for {n_args} arguments")  # Numba intrinsics need fixed arity


@intrinsic
def fma_f32(typingctx, a, b, c):  # noqa: ANN001, ANN201
    """a * b + c rounded once (llvm.fma): a fused multiply-add fixed in the code, where one left to
    fast-math 'contract' is formed or not depending on how the kernel was inlined and compiled."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.fma(*args)

    return sig, codegen


@intrinsic
def prefetch_l2(typingctx, addr):  # noqa: ANN001, ANN201
    """Ask for the cache line at byte address `addr` into L2 (llvm.prefetch, read, locality 1: x86
    prefetcht2, ARM pldl2keep); never faults, whatever the address."""
    sig = types.void(types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        i8p = ir.IntType(8).as_pointer()
        fn = declare(builder.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, I32, I32, I32])
        ptr = builder.inttoptr(args[0], i8p)
        builder.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 1), ir.Constant(I32, 1)])
        return context.get_dummy_value()

    return sig, codegen
