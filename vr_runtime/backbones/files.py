"""Local checkpoint directories, shared by every backbone: what a directory must hold, its
model_type, and its tokenizer with the chat template kept beside the processor."""
from __future__ import annotations

import json
import pathlib
import re
from typing import Optional

from ..errors import ModelFilesError

# "org/name" as the Hub spells repository ids; anything else is taken as a local path only.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_hub_id(name: str) -> bool:
    return bool(HUB_ID.match(name)) and ".." not in name


def cached_snapshot(repo_id: str) -> pathlib.Path:
    """The local Hugging Face cache's snapshot of ``repo_id`` (its ``main`` revision), found
    without touching the network (``HF_HUB_CACHE`` / ``HF_HOME`` pick the cache, as for every
    Hugging Face library). Not cached, or cached incompletely: ``ModelFilesError`` giving the
    download command; nothing is ever downloaded here."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub import constants
    except ImportError:  # transformers depends on it; a broken install still gets one line
        raise ModelFilesError(f"model {repo_id!r}: not a local directory, and huggingface_hub "
                              f"is not installed to look it up in the Hugging Face cache") from None
    try:
        return pathlib.Path(snapshot_download(repo_id, local_files_only=True))
    except (OSError, ValueError) as e:
        # LocalEntryNotFoundError / IncompleteSnapshotError are OSErrors, a malformed id is a
        # ValueError (HFValidationError).
        partly = "only partly in" if type(e).__name__ == "IncompleteSnapshotError" else "not in"
        raise ModelFilesError(f"model {repo_id!r}: no such local directory, and {partly} the "
                              f"Hugging Face cache ({constants.HF_HUB_CACHE}); download it "
                              f"with: hf download {repo_id}") from None


def check_weights_dir(path: pathlib.Path, model_type: str, layout: str, hint: str = "") -> None:
    """A local checkpoint directory with config.json, safetensors and a tokenizer of
    ``model_type``; ``ModelFilesError`` naming what is missing otherwise."""
    if not path.is_dir():
        raise ModelFilesError(f"model {str(path)!r}: not a directory; pass a local {layout} "
                              f"directory (or a preset name); nothing is downloaded")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not (list(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()):
        missing.append("*.safetensors")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        missing.append("tokenizer.json / tokenizer_config.json")
    if missing:
        raise ModelFilesError(f"model {str(path)!r}: missing {', '.join(missing)}; expected a "
                              f"{layout} checkpoint directory")
    mtype = read_model_type(path)
    if mtype != model_type:
        raise ModelFilesError(f"model {str(path)!r}: config.json has model_type {mtype!r}, expected "
                              f"{model_type!r}" + (f" ({hint})" if hint else ""))


def read_model_type(path: pathlib.Path) -> Optional[str]:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise ModelFilesError(f"model {str(path)!r}: unreadable config.json ({e})") from None


def load_dir_tokenizer(path: pathlib.Path, auto_tokenizer):
    """The directory's tokenizer, with the chat template from the processor files when the
    tokenizer itself has none (``chat_template.jinja`` / ``chat_template.json``)."""
    try:
        tok = auto_tokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelFilesError(f"model {str(path)!r}: tokenizer could not be loaded ({e})") from e
    if not getattr(tok, "chat_template", None):
        tok.chat_template = _dir_chat_template(path)
    return tok


def _dir_chat_template(path: pathlib.Path) -> Optional[str]:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "processor_config.json"):
        f = path / name
        if f.is_file():
            try:
                tpl = json.loads(f.read_text()).get("chat_template")
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
            if isinstance(tpl, str):
                return tpl
    return None


__all__ = ["cached_snapshot", "looks_like_hub_id", "check_weights_dir", "read_model_type", "load_dir_tokenizer"]


def load_hf_model(model_cls, path: pathlib.Path, device="cpu", dtype=None,
                  attn_implementation: Optional[str] = None):
    """``model_cls.from_pretrained`` on a checked local directory (safetensors only, never
    remote code), in eval mode, and the directory's tokenizer -> (model, tokenizer, device,
    dtype). A flash-attention implementation picked automatically but refused falls back to
    sdpa; weights absent from the files (which transformers only warns about, leaving them
    random) are one ``ModelFilesError``."""
    from transformers import AutoTokenizer
    from .devices import pick_attn_implementation, resolve_device, resolve_dtype
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    attn = pick_attn_implementation(attn_implementation, dev, dt)
    kw = dict(local_files_only=True, use_safetensors=True, trust_remote_code=False,
              device_map={"": str(dev)}, output_loading_info=True)
    try:
        try:
            model, info = model_cls.from_pretrained(str(path), dtype=dt, attn_implementation=attn,
                                                    **kw)
        except (ImportError, ValueError):
            if attn == "sdpa" or attn_implementation:
                raise
            model, info = model_cls.from_pretrained(str(path), dtype=dt,
                                                    attn_implementation="sdpa", **kw)
    except (OSError, ImportError, ValueError) as e:
        raise ModelFilesError(f"model {str(path)!r}: could not be loaded "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
    missing = sorted((info or {}).get("missing_keys") or [])
    if missing:
        raise ModelFilesError(f"model {str(path)!r}: the safetensors files lack {len(missing)} "
                              f"weight(s) (e.g. {', '.join(missing[:3])}); the checkpoint is "
                              f"incomplete")
    return model.eval(), load_dir_tokenizer(path, AutoTokenizer), dev, dt
