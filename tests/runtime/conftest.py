"""Session-scoped fixtures of the tiny InternVL3 preset, shared by the runtime tests (and by
anyone else's tests: ``tiny_lm`` / ``tiny_vr``). Built once per session; tests must not mutate
them (copy first)."""
import pytest
import torch


@pytest.fixture(scope="session")
def tiny_lm():
    from vr_runtime.backbones import load_backbone
    torch.manual_seed(0)
    return load_backbone("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_vr(tiny_lm):
    """VideoRouter on the tiny model with fresh, *untrained* routers (independent of any
    routers.safetensors shipped in the assets, so results do not depend on training)."""
    from vr_runtime.routing.routers import Routers
    from vr_runtime.runtime import VideoRouter
    return VideoRouter(tiny_lm, Routers.from_backbone(tiny_lm))


@pytest.fixture
def frames():
    """A few random 448x448 'frames' (fresh per test; the seed varies with the test)."""
    def make(T=3, seed=0):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(T, 3, 448, 448, generator=g)
    return make


@pytest.fixture
def small_config():
    """Factory of a shape preset (HF config.json layout) smaller than tiny, for backbone_from_config tests."""
    import json
    from vr_runtime.backbones.tiny import ASSETS

    def make(hidden=96, layers=4, vocab=2048):
        cfg = json.loads((ASSETS / "config.json").read_text())
        cfg["text_config"].update(hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab,
                                  intermediate_size=2 * hidden, num_attention_heads=4,
                                  num_key_value_heads=2)
        cfg["vision_config"].update(hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                    num_hidden_layers=1)
        cfg["image_token_id"] = 0  # rewritten by backbone_from_config to the tiny tokenizer's id
        return cfg
    return make
