"""The Triton kernels compile for a real GPU target (sm_90) on any machine, GPU or not.

CPU CI runs the kernels under the interpreter, which accepts code the compiler rejects (and the
reverse); this compiles every variant ahead of time through Triton's NVIDIA backend (ptxas ships
with the triton wheel), in a subprocess without TRITON_INTERPRET, and checks the bf16 forward
uses 16-byte vector loads and round-to-nearest conversion.
"""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r'''
    import importlib, re, sys
    import triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    m = importlib.import_module("vr_kernels.pool_pack")
    target = GPUTarget("cuda", 90, 32)

    def build(jf, types, consts, aligned=()):
        names = jf.arg_names
        sig = {n: types.get(n, "constexpr") for n in names}
        cst = {(names.index(n),): v for n, v in consts.items()}
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
        return triton.compile(ASTSource(fn=jf, signature=sig, constexprs=cst, attrs=attrs),
                              target=target, options=dict(num_warps=4))

    for dt in ("bf16", "fp16", "fp32"):
        types = dict(x=f"*{dt}", y=f"*{dt}", tiles="*i32", H="i32", W="i32", D="i32",
                     stride_xt="i32", stride_xn="i32", stride_yr="i32")
        k = build(m._pool_pack_fwd_kernel.fn, types,
                  dict(stride_xd=1, stride_yd=1, BLOCK_T=16, BLOCK_D=256),
                  aligned=("x", "y", "tiles", "D", "stride_xt", "stride_xn", "stride_yr"))
        if dt == "bf16":
            ptx = k.asm["ptx"]
            assert "ld.global.v4.b32" in ptx, "forward loads are not 16-byte vectors"
            assert "cvt.rn.bf16" in ptx, "forward does not round to nearest"
        types = dict(dy=f"*{dt}", dx=f"*{dt}", dy_kept=f"*{dt}", tiles="*i32", H="i32", W="i32",
                     D="i32", stride_dyr="i32", stride_xt="i32", stride_xn="i32", stride_kr="i32")
        for wd in (True, False):
            for zd in (True, False):
                build(m._pool_pack_bwd_kernel.fn, types,
                      dict(stride_dyd=1, stride_xd=1, stride_kd=1, BLOCK_T=16, BLOCK_D=256,
                           WRITE_DX=wd, ZERO_DY=zd))
    print("compiled")
''')


def test_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-4000:]
