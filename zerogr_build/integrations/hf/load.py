"""A saved Hugging Face model for `zerogr compare --hf-model DIR`: loaded offline, and named by a hash.

    model = load_hf_model("ckpt/", device="cpu")    # a local save_pretrained dir; never downloads
    tag = model_hash(model)                          # "sha256-<64 hex>" of its parameters

load_hf_model sets HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE and passes local_files_only, and never runs code
from the directory (trust_remote_code stays False): the dir must hold a config.json of a model class
transformers ships, and its weights. Encoder-decoder configs load as AutoModelForSeq2SeqLM, the rest as
AutoModelForCausalLM, in the dtype they were saved in, in eval mode.

model_hash names a model by what it computes: the sha256 over its state dict (every tensor's name, dtype,
shape and bytes, in name order). The gate files its record under it when no tag is given, and SidGenerator
(order="auto") computes the same hash of the model it is handed, so the two meet without a tag as long as
the served weights are the measured ones (same values, same dtype).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from ...base.errors import InputError

OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def load_hf_model(path: str | Path, device: str = "cpu"):
    """The model saved in a local save_pretrained dir, on `device`, in eval mode (module docstring).
    InputError naming the dir when it is not one (no config.json, unknown model type, broken weights)."""
    for name in OFFLINE_ENV:
        os.environ[name] = "1"
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"--hf-model {path}: not a directory (a model saved with save_pretrained)")
    if not (path / "config.json").is_file():
        raise InputError(f"--hf-model {path}: no config.json (not a save_pretrained directory)")
    import transformers

    transformers.utils.logging.disable_progress_bar()  # no per-shard bars in a gate's log
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        auto = (
            transformers.AutoModelForSeq2SeqLM
            if getattr(config, "is_encoder_decoder", False)
            else transformers.AutoModelForCausalLM
        )
        model = auto.from_pretrained(
            path, config=config, local_files_only=True, trust_remote_code=False, dtype="auto"
        )
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad dir
        raise InputError(f"--hf-model {path}: cannot load ({type(exc).__name__}: {exc})") from None
    if model.get_output_embeddings() is None:
        raise InputError(f"--hf-model {path}: {type(model).__name__} has no language-model head")
    return model.to(device).eval()


def model_hash(model) -> str:
    """ "sha256-<64 hex>" over the model's state dict: each tensor's name, dtype, shape and bytes, sorted
    by name (module docstring)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}\0{str(t.dtype)}\0{tuple(tensor.shape)}\0".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256-" + digest.hexdigest()


__all__ = ["OFFLINE_ENV", "load_hf_model", "model_hash"]
