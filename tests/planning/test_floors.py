"""The cost model's weight, KV and decode counts (vr_runtime.planning.cost_model), against the modules
themselves: a Qwen2 decoder layer of the 8B config built on the meta device, the tiny runtime's
shadow stack; and the shape of the decode-step floor."""
import json

import torch

from vr_runtime.planning.cost_model import (DEVICES, decode_step_costs, decoder_layer_params,
                                   kv_cache_bytes, load_shape, shadow_stack_bytes)
from vr_runtime.backbones.tiny import ASSETS

CONFIG_8B = "vr_runtime/configs/internvl3_8b.json"


def _params(m):
    return sum(p.numel() for p in m.parameters())


def test_decoder_layer_and_shadow_stack_of_the_8b_config():
    from transformers import AutoConfig, AutoModel
    with open(CONFIG_8B) as f:
        tc = json.load(f)["text_config"]
    with torch.device("meta"):
        m = AutoModel.from_config(AutoConfig.for_model(**dict(tc, num_hidden_layers=1,
                                                              vocab_size=1)))
    s = load_shape(CONFIG_8B)
    assert decoder_layer_params(s) == _params(m.layers[0]) == 233_057_792
    b = shadow_stack_bytes(s)                       # 4 layers, bf16
    assert b == 4 * 233_057_792 * 2
    assert 1.7 < b / 2**30 < 1.8                    # "about 1.7 GB" (GiB)


def test_counts_match_the_tiny_runtime(tiny_vr):
    s = load_shape(str(ASSETS / "config.json"))
    k = tiny_vr.routers.config.num_layers
    assert _params(tiny_vr.routers.shadow) == k * decoder_layer_params(s)
    layers = tiny_vr.lm.decoder().layers
    assert all(_params(layer) == decoder_layer_params(s) for layer in layers)
    cfg = tiny_vr.lm.text_config
    kv = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert kv_cache_bytes(s, 100, 4) == cfg.num_hidden_layers * 2 * 100 * kv * 4


def test_decode_step_floor_reads_the_weights_once_a_step():
    s = load_shape(CONFIG_8B)
    one, four = (decode_step_costs(s, 8000, "h100", b) for b in (1, 4))
    weights = (s.layers * decoder_layer_params(s) + s.vocab * s.d) * 2
    assert weights < one["bytes"] < 1.1 * weights          # weights dominate a step's bytes
    assert four["flops"] == 4 * one["flops"]
    assert one["bytes"] < four["bytes"] < 1.5 * one["bytes"]  # the 4 rows share the weights
    assert one["seconds"] == one["bytes"] / DEVICES["h100"].bandwidth   # memory-bound
