"""The load-time weight checks: ``nonfinite`` finds exactly the tensors a per-tensor isfinite
finds (any dtype, device mix, NaN, +inf, -inf, a single bad element in a large tensor), names
them in order, and passes the shipped tiny weights; the tiny preset's parameters are the
shipped safetensors file, bit for bit."""
import pytest
import torch

from vr_runtime.backbones.weights import copy_state_strict, nonfinite


def _reference(named, limit=3):
    """The check as it was: one isfinite per tensor."""
    bad = [n for n, t in named if torch.is_tensor(t) and t.is_floating_point()
           and not bool(torch.isfinite(t).all())]
    if not bad:
        return None
    more = ", ..." if len(bad) > limit else ""
    return f"{len(bad)} tensor(s) hold NaN or inf ({', '.join(bad[:limit])}{more})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_bad_element_is_found_in_every_float_dtype(dtype, bad):
    big = torch.zeros(300_001, dtype=dtype)
    big[123_457] = bad
    named = [("ok", torch.ones(3, dtype=dtype)), ("big", big), ("ok2", torch.ones(2, 2))]
    assert nonfinite(named) == "1 tensor(s) hold NaN or inf (big)" == _reference(named)


def test_largest_finite_values_are_not_taken_for_inf():
    named = [(f"{dt}", torch.tensor([torch.finfo(dt).max, -torch.finfo(dt).max], dtype=dt))
             for dt in (torch.float16, torch.bfloat16, torch.float32)]
    assert nonfinite(named) is None


def test_names_count_and_limit_match_the_per_tensor_check():
    g = torch.Generator().manual_seed(0)
    named = []
    for i in range(40):
        dt = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
        t = torch.randn(i + 1, 5, generator=g).to(dt)
        if i in (3, 7, 8, 21, 39):
            t.view(-1)[i % t.numel()] = (float("nan"), float("inf"), float("-inf"))[i % 3]
        named.append((f"p{i}", t))
    named += [("ids", torch.arange(4)), ("empty", torch.empty(0)), ("flag", torch.tensor(True)),
              ("not a tensor", 1.5)]
    got = nonfinite(named)
    assert got == _reference(named) == "5 tensor(s) hold NaN or inf (p3, p7, p8, ...)"
    assert nonfinite(named, limit=10) == _reference(named, limit=10)
    assert nonfinite(iter(named)) == got          # a generator, as named_parameters() is


def test_parameters_that_need_grad_are_checked_without_a_graph():
    lin = torch.nn.Linear(4, 4)
    assert nonfinite(lin.named_parameters()) is None
    with torch.no_grad():
        lin.bias[1] = float("nan")
    assert nonfinite(lin.named_parameters()) == "1 tensor(s) hold NaN or inf (bias)"
    assert lin.weight.grad is None


def test_the_shipped_tiny_weights_pass_and_load_bit_for_bit(tiny_lm):
    from safetensors.torch import load_file
    from vr_runtime.backbones.tiny import ASSETS
    path = ASSETS / "model.safetensors"
    if not path.is_file():
        pytest.skip("no shipped tiny weights")
    assert nonfinite(tiny_lm.model.named_parameters()) is None
    state = load_file(str(path))
    own = tiny_lm.model.state_dict()
    assert set(state) == set(own)
    for k, v in state.items():
        assert own[k].dtype == v.dtype and torch.equal(own[k], v), k


def test_copy_state_strict_refuses_a_misfit_and_copies_nothing():
    lin = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in lin.state_dict().items()}
    misfit = copy_state_strict(lin, {"weight": torch.zeros(3, 2), "bias": torch.zeros(2)})
    assert "wrong shape" in misfit and "weight (3, 2) vs (2, 2)" in misfit
    assert all(torch.equal(lin.state_dict()[k], v) for k, v in before.items())
