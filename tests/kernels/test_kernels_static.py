"""Static checks of the Triton kernels on sm_90 (H100), no GPU needed.

CPU CI runs the kernels under the interpreter, which accepts code the compiler rejects (and the
reverse), and says nothing of what the GPU would execute. Here every shipped autotuning
configuration (both element sizes, forward and the backward variants that write the frames'
gradient) is compiled for sm_90 through Triton's NVIDIA backend (ptxas and cuobjdump ship with
the triton wheel), in subprocesses without TRITON_INTERPRET, and its SASS is held to the bounds
of ``vr_kernels.sass`` (``BOUNDS``): no spill, >= 50% theoretical occupancy, no barrier,
128-bit global loads and stores in every specialised window's loop, and at most a stated number
of instructions per loaded (fwd) / stored (bwd) element there. ``python -m
bench.scripts.bench_kernels_static`` records the same figures in
``bench/results/kernels_sm90_static.json``.
"""
import pytest

from vr_kernels import sass


@pytest.fixture(scope="module")
def compiled():
    pytest.importorskip("triton.backends.nvidia")
    # Every configuration of both element sizes (bf16 stands for the 2-byte types; fp16 differs in
    # its conversions only and is in bench/results/kernels_sm90_static.json), forward and the
    # backward variant with the most work (dx and dy_kept's zeros): 16 compiles, ~40 s on 2 cores.
    jobs = sass.shipped_jobs(dtypes=("bf16", "fp32"), bwd_variants=[(True, True)])
    return sass.run_jobs(jobs, workers=2)


def test_every_shipped_config_compiles_within_bounds(compiled):
    results = compiled
    from vr_kernels.pool_pack import CONFIGS
    assert all(len(c) <= 4 for c in CONFIGS.values())
    assert len(results) == sum(len(c) for c in CONFIGS.values()) * 2
    bad = [v for r in results for v in sass.violations(r)]
    assert not bad, "\n".join(bad)


def test_reductions_stay_in_a_thread_and_divide_per_row_only(compiled):
    results = compiled
    for r in results:
        assert r["shared_bytes"] == 0 and r["barriers"] == 0 and not r["mix"].get("shuffle")
        # Divisions only in the generic path's per-row reciprocal and window arithmetic (one each).
        assert r["ptx_div_full_f32"] <= 2 and r["ptx_int_div"] <= 2, r["config"]


def test_bf16_rounds_to_nearest_even(compiled):
    results = compiled
    for r in results:
        if r["dtype"] == "bf16" and r["kernel"] == "fwd":
            assert r["ptx_cvt_rn_bf16"] > 0, r["config"]


def test_sass_parser_on_a_known_snippet():
    text = """
        /*0100*/                   MOV R1, c[0x0][0x28] ;
        /*0110*/              @P0 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0120*/                   FADD R8, R4, R5 ;
        /*0130*/              @P0 STG.E.128 desc[UR4][R6.64], R8 ;
        /*0140*/              @!P1 BRA 0x110 ;
        /*0150*/                   EXIT ;
    """
    ins = sass.parse_sass(text)
    assert [i["op"] for i in ins] == ["MOV", "LDG.E.128", "FADD", "STG.E.128", "BRA", "EXIT"]
    (lp,) = sass.loops(ins, elem_bytes=2)
    assert lp["instructions"] == 4 and lp["ldg128"] == 1 and lp["elements_loaded"] == 8
    assert lp["instr_per_loaded_element"] == 0.5
    (hot,) = sass.hot_loops([lp], "fwd")
    assert hot["path"] == "1x1"
    assert sass.occupancy(64, 0, 4) == 0.5 and sass.occupancy(128, 0, 4) == 0.25
    assert sass.occupancy(32, 0, 1) == 0.5  # 32 blocks of one warp at most
