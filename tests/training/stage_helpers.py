"""Small stage configs for the training tests (shared by the tests and the DDP worker).

A plain module, not conftest: `from conftest import ...` resolves to whichever conftest.py
pytest imported first, which breaks when several test folders run together. The configs are the
tiny model's (``vr_tiny/configs``; importing ``vr_tiny`` makes their names known)."""
import vr_tiny  # noqa: F401


def stage_config(stage, data, out, **kw):
    from vr_runtime.training.config import load_config
    names = {1: "relevance", 2: "policy", 3: "conversations"}
    base = dict(train_data=data[names[stage]], eval_data=None, output_dir=str(out), routers=None,
                max_steps=2, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                logging_steps=1, report_to=[], frames_per_example=3, pool_pack_backend="torch",
                router_dim=32, router_heads=4, warmup_ratio=0.0, lr_scheduler_type="constant")
    base.update(kw)
    return load_config(f"tiny_stage{stage}", **base)


def stage3_trainee(lm, **over):
    """A Stage 3 Trainee on ``lm`` with small seeded routers and plans from the labels
    (``over``: config overrides)."""
    from vr_runtime.routing.routers import RouterConfig, Routers
    from vr_runtime.training.config import load_config
    from vr_runtime.training.stages import Trainee
    routers = Routers.from_backbone(lm, RouterConfig(router_dim=32, num_heads=4, router_pool=2),
                                    seed=1)
    cfg = load_config("tiny_stage3", routers=None, plan_from="labels", **over)
    return Trainee(lm, routers, cfg)


def projector_features(model, T, seed=None):
    """Random pre-projector features [T, 256, width] of ``T`` frames (what the feature cache
    holds), ``width`` the input of ``model``'s projector; seeded when ``seed`` is given."""
    import torch
    proj = next(m for n, m in model.named_modules() if n.endswith("multi_modal_projector"))
    width = next(m for m in proj.modules() if isinstance(m, torch.nn.Linear)).in_features
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return torch.randn(T, 256, width, generator=gen)
