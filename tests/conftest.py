"""Shared pytest set-up: CI runs hypothesis derandomized (the same examples every run, so a red CI
points at a change, not at a lucky draw); locally every run draws new examples."""

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# --- GPU kernels ---
# Every bundle the suite builds ships compiled kernels when nvcc is found: one session-wide cache folder
# means nvcc runs once per (source, arch, kind) for the whole run, not once per build, and the user's
# ~/.cache/zerogr is never touched. CLI subprocesses inherit it through the environment.
if not os.environ.get("ZEROGR_CACHE_DIR"):
    import tempfile

    os.environ["ZEROGR_CACHE_DIR"] = tempfile.mkdtemp(prefix="zerogr-test-cache-")


# --- hf integration ---
# Tiny, seeded, randomly initialised transformers models (no downloads). Vocabulary: 0 pad, 1 eos,
# 2 bos / decoder start, SID tokens from HF_SID_OFFSET on, and ordinary words above them, so normalising
# over the whole vocabulary differs from normalising over the SID codes.
HF_VOCAB = 40
HF_SID_OFFSET = 3


HF_CONFIGS = {  # (config class, model class, config kwargs); std 0.3 keeps scores apart (no near-ties)
    "t5": ("T5Config", "T5ForConditionalGeneration", {
        "d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 2,
        "decoder_start_token_id": 2}),
    "bart": ("BartConfig", "BartForConditionalGeneration", {
        "d_model": 16, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32,
        "max_position_embeddings": 64, "init_std": 0.3, "decoder_start_token_id": 2,
        "forced_bos_token_id": None, "forced_eos_token_id": None}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {
        "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 64, "initializer_range": 0.3}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 64, "initializer_range": 0.3}),
}  # fmt: skip


def _tiny_hf_model(kind: str, seed: int):
    import torch
    import transformers

    config_cls, model_cls, kwargs = HF_CONFIGS[kind]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(
        vocab_size=HF_VOCAB, pad_token_id=0, eos_token_id=1, bos_token_id=2, **kwargs
    )
    model = getattr(transformers, model_cls)(config)
    if kind == "bart":
        with torch.no_grad():
            model.final_logits_bias.normal_()  # zeros by default: let the tests see whether it is added
    return model.eval()


@pytest.fixture(scope="session")
def tiny_hf_models() -> dict:
    """{"t5", "bart", "gpt2", "llama"}: tiny seeded models in eval mode, built once per session."""
    pytest.importorskip("transformers")
    return {kind: _tiny_hf_model(kind, seed) for seed, kind in enumerate(HF_CONFIGS, start=1)}


# --- slow tests ---
# `@pytest.mark.slow` tests (the real datasets, real training) are skipped unless asked for with
# `python -m pytest --run-slow` (or selected with `-m slow --run-slow`); the default suite stays fast.
def pytest_addoption(parser):
    parser.addoption(
        "--run-slow", action="store_true", default=False, help="also run @pytest.mark.slow tests"
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# --- object storage ---
# A real S3 API server (moto's server mode) on 127.0.0.1, started once per session. It enforces
# conditional writes (If-None-Match / If-Match); pyarrow and boto3 reach it through AWS_ENDPOINT_URL.
# `s3_env` points the standard AWS_* variables at it for one test; `s3_bucket` also makes a fresh bucket.
@pytest.fixture(scope="session")
def s3_server() -> str:
    """The endpoint URL of a moto S3 server on 127.0.0.1 (one per test session)."""
    pytest.importorskip("moto.server")
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "zerogr-test-key-id",
    "AWS_SECRET_ACCESS_KEY": "zerogr-test-secret-do-not-log",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture()
def s3_env(s3_server, monkeypatch) -> dict[str, str]:
    """AWS_* environment (endpoint + dummy credentials) for the moto server; CLI subprocesses inherit it."""
    env = {"AWS_ENDPOINT_URL": s3_server, **S3_CREDENTIALS}
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture()
def s3_bucket(s3_env) -> str:
    """A new, empty bucket on the moto server; returns its name."""
    import uuid

    import boto3

    name = f"zg-{uuid.uuid4().hex[:16]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture()
def remote(s3_bucket) -> str:
    """A remote OUT on the moto server: s3://<fresh bucket>/fleet/bundles."""
    return f"s3://{s3_bucket}/fleet/bundles"


@pytest.fixture()
def keys(tmp_path) -> dict:
    """Two signing key pairs, as `zerogr keys new` makes them: {"a": private key path, "a.pub": public key
    path, "b": ..., "b.pub": ...}."""
    from pathlib import Path

    from zerogr_build.fleet.keys import new_key

    made = {}
    for name in ("a", "b"):
        key = new_key(tmp_path / "keys" / name)
        made[name], made[f"{name}.pub"] = Path(key.private_path), Path(key.public_path)
    return made


@pytest.fixture()
def build_out(tmp_path):
    """A local OUT on the 'build box' with two versions (v1, v2; LATEST = v2)."""
    from zerogr_build.testing import publish_catalog, random_catalog

    out = tmp_path / "build"
    publish_catalog(random_catalog(seed=1), out)
    publish_catalog(random_catalog(seed=2, string_ids=True), out)
    return out


# --- Ray (the --engine ray tests) ---
# Tests marked xdist_group run on one xdist worker, so the suite starts one Ray cluster, not one per worker:
# `-n 2` distributes with loadgroup instead of load (the same as load for every unmarked test).
def pytest_configure(config):
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"  # the controller: schedule by group
    if hasattr(config, "workerinput"):
        config.option.loadgroup = True  # a worker: name each grouped test's group in its node id
