"""The vLLM guide's blocks run as written, in this venv (the main suite skips `# needs: vllm` blocks)."""

from __future__ import annotations

from tests_docs.test_docs_examples import REPO, RUN_LANGS, _scratch, fenced_blocks, run_block


def test_the_vllm_guide_runs(tmp_path):
    path = REPO / "docs" / "serving-engines.md"
    blocks = fenced_blocks(path.read_text(), "docs/serving-engines.md")
    blocks = [b for b in blocks if b.lang in RUN_LANGS and "ci" not in b.needs]
    assert any("vllm" in b.needs for b in blocks)
    work, env = _scratch(tmp_path)
    scripts = tmp_path / "blocks"
    scripts.mkdir()
    for index, block in enumerate(blocks):
        run_block(block, work, env, scripts, index)
