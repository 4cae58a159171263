"""16-byte loads of int32 words: load4(a, r, j) -> (a[r, j], a[r, j+1], a[r, j+2], a[r, j+3]) in one
vector load (ld.global.v4) on a GPU, where a scalar loop issues four 4-byte loads.

The caller guarantees alignment: a 2-D C-contiguous int32 array whose rows are a multiple of 4 words, j a
multiple of 4, base address 16-byte aligned (device allocations are 256-byte aligned). The matmul checks
this for its weights and activations before it launches (matmul.py: check_vec4). The simulator runs the
plain four loads (it cannot run an LLVM intrinsic).
"""

from __future__ import annotations

from edgellm.backends.cuda.config import SIMULATOR

if SIMULATOR:

    def load4(a, r, j):  # noqa: ANN001, ANN201
        return a[r, j], a[r, j + 1], a[r, j + 2], a[r, j + 3]

else:  # pragma: no cover - compiled for a GPU (scripts/gpu/cuda_compile_check.py checks the PTX here)
    from llvmlite import ir
    from numba import types

    try:  # numba-cuda's own copies (0.2x on); older releases use numba's
        from numba.cuda import cgutils
        from numba.cuda.extending import intrinsic
    except ImportError:  # pragma: no cover - depends on the installed numba-cuda
        from numba.core import cgutils
        from numba.core.extending import intrinsic

    @intrinsic
    def load4(typingctx, a, r, j):  # noqa: ANN001, ANN201, ARG001
        if not (isinstance(a, types.Array) and a.ndim == 2 and a.dtype == types.int32 and a.layout == "C"):
            return None
        sig = types.UniTuple(types.int32, 4)(a, r, j)

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            aty, rty, jty = sig.args
            ary = context.make_array(aty)(context, builder, args[0])
            idx = [context.cast(builder, v, t, types.intp) for v, t in ((args[1], rty), (args[2], jty))]
            ptr = cgutils.get_item_pointer(context, builder, aty, ary, idx, wraparound=False)
            vty = ir.VectorType(ir.IntType(32), 4)
            vec = builder.load(builder.bitcast(ptr, vty.as_pointer()), align=16)
            words = [builder.extract_element(vec, ir.Constant(ir.IntType(32), i)) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, words)

        return sig, codegen
