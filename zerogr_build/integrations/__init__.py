"""Bridges from the zerogr runtime to other model stacks.

`integrations.hf` (a package, extra `[hf]`): a SID logits processor for Hugging Face `generate` and a
filter-first `generate` over HF models. Import it explicitly (`from zerogr_build.integrations import hf`);
nothing here imports transformers at load. `integrations.vllm` (a package, in a venv with vLLM): a V1
logits processor and a constrained beam search for vLLM; nothing imports vLLM until it is imported.
sid_map.py and vocab_masks.py: SIDs spelled as vocabulary
tokens, for any stack.
"""
