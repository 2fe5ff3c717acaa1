"""A small TIGER-like generative recommender in torch: encoder over the history, decoder over SID tokens.

- Encoder: each history item is the sum of its SID tokens' embeddings (one table per level) plus a position
  embedding; a causal Transformer encoder, so the state at position j has seen items 0..j only. Item-level
  (not token-level) history keeps CPU training to minutes; causality lets one pass over a sequence train
  every next-item target in it, and inference on a history of length n matches training exactly.
- Decoder: a Transformer decoder over [BOS, s_0, ..., s_{L-2}] (causal self-attention, cross-attention to
  the encoder states of the history). Its output at position t, after a final LayerNorm, is the hidden
  vector h_t [d]; step t's logits are W_t h_t with W_t [V_t, d] (no bias) -- the per-step output layers
  a `zerogr_build.runtime.Decoder` takes as `weights`.
- Trained with teacher forcing and cross-entropy over all V_t tokens at every step (TIGER's objective; the
  model is never told which codes exist, which is why it puts some probability on invalid tokens).

Deterministic for a seed: seeded torch + numpy, `torch.use_deterministic_algorithms(True)`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from zerogr_build.base.progress import NULL_PROGRESS, Progress


@dataclass(frozen=True)
class ModelConfig:
    """Model and training hyper-parameters (fixed up front; not tuned toward any metric)."""

    d_model: int = 64
    n_heads: int = 4
    enc_layers: int = 2
    dec_layers: int = 2
    ff_mult: int = 4
    max_history: int = 50
    dropout: float = 0.0
    epochs: int = 10
    batch_windows: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    seed: int = 0


class TigerLike(nn.Module):
    """Encoder/decoder over SID tokens. `codebook_sizes` V_0..V_{L-1}; SIDs int64 [.., L]."""

    def __init__(self, codebook_sizes: Sequence[int], cfg: ModelConfig):
        super().__init__()
        self.codebook_sizes = tuple(int(v) for v in codebook_sizes)
        self.cfg = cfg
        d, num_steps = cfg.d_model, len(self.codebook_sizes)
        self.hist_tokens = nn.ModuleList(nn.Embedding(v, d) for v in self.codebook_sizes)
        self.hist_pos = nn.Embedding(cfg.max_history, d)
        self.dec_tokens = nn.ModuleList(nn.Embedding(v, d) for v in self.codebook_sizes)
        self.bos = nn.Parameter(torch.zeros(d))
        self.dec_pos = nn.Embedding(num_steps, d)
        enc_layer = nn.TransformerEncoderLayer(
            d, cfg.n_heads, cfg.ff_mult * d, cfg.dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(enc_layer, cfg.enc_layers, enable_nested_tensor=False)
        self.enc_norm = nn.LayerNorm(d)
        dec_layer = nn.TransformerDecoderLayer(
            d, cfg.n_heads, cfg.ff_mult * d, cfg.dropout, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(dec_layer, cfg.dec_layers)
        self.dec_norm = nn.LayerNorm(d)
        self.heads = nn.ModuleList(nn.Linear(d, v, bias=False) for v in self.codebook_sizes)
        nn.init.normal_(self.bos, std=0.02)

    @property
    def num_steps(self) -> int:
        return len(self.codebook_sizes)

    def encode(self, history: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """history int64 [B, S, L] (right-padded), lengths int64 [B] -> states float32 [B, S, d] (causal)."""
        s = history.shape[1]
        x = sum(emb(history[..., t]) for t, emb in enumerate(self.hist_tokens))
        x = x + self.hist_pos(torch.arange(s, device=history.device))[None]
        pos = torch.arange(s, device=history.device)
        causal = pos[None, :] > pos[:, None]  # True = hidden
        pad = pos[None, :] >= lengths[:, None]
        return self.enc_norm(self.encoder(x, mask=causal, src_key_padding_mask=pad))

    def decode(
        self,
        prefixes: torch.Tensor,
        memory: torch.Tensor,
        memory_pad: torch.Tensor,
        causal_memory: bool = False,
    ) -> torch.Tensor:
        """Hidden vectors float32 [B, n, t+1, d] for n independent SID prefixes per memory row.

        prefixes int64 [B, n, t] (block i of row b decodes prefix prefixes[b, i]); memory float32 [B, S, d];
        memory_pad bool [B, S] (True = padding). causal_memory: block i sees memory positions 0..i only
        (training: block i predicts the item after history position i); else every block sees all of it.
        Position j of a block is the hidden vector for step j (its logits are heads[j]).

        The n blocks are packed into one sequence of n*(t+1) tokens with a block-diagonal causal mask, so the
        memory's keys/values are projected once per row, not once per prefix.
        """
        b, n, t = prefixes.shape
        dev = prefixes.device
        x = [self.bos.expand(b, n, 1, -1)]
        if t:
            x.append(torch.stack([self.dec_tokens[j](prefixes[..., j]) for j in range(t)], dim=2))
        x = torch.cat(x, dim=2) + self.dec_pos(torch.arange(t + 1, device=dev))[None, None]
        block = torch.arange(n, device=dev).repeat_interleave(t + 1)  # block of each packed token
        pos = torch.arange(t + 1, device=dev).repeat(n)
        tgt_mask = (block[:, None] != block[None, :]) | (pos[None, :] > pos[:, None])  # True = hidden
        mem_mask = None
        if causal_memory:
            mem_mask = torch.arange(memory.shape[1], device=dev)[None, :] > block[:, None]
        out = self.decoder(
            x.reshape(b, n * (t + 1), -1),
            memory,
            tgt_mask=tgt_mask,
            memory_mask=mem_mask,
            memory_key_padding_mask=memory_pad,
        )
        return self.dec_norm(out).reshape(b, n, t + 1, -1)

    def output_weights(self) -> list[torch.Tensor]:
        """Per-step output layers, detached: weights[t] float32 [V_t, d]."""
        return [head.weight.detach().clone() for head in self.heads]


def _windows(sequences: Sequence[np.ndarray], length: int) -> list[np.ndarray]:
    """Cut each item sequence into windows of at most length+1 items (inputs + shifted targets), from the end.

    Consecutive windows share one item (a window's last target is the next window's first input), so every
    event after a user's first is a target exactly once.
    """
    out = []
    for seq in sequences:
        end = len(seq)
        while end >= 2:
            start = max(0, end - (length + 1))
            out.append(np.asarray(seq[start:end], dtype=np.int64))
            end = start + 1
    return out


def _pad_histories(histories: Sequence[np.ndarray], length: int, sid_table: torch.Tensor):
    """Right-padded SID histories int64 [B, S, L] (last `length` items of each) and lengths int64 [B]."""
    cut = [np.asarray(h[-length:], dtype=np.int64) for h in histories]
    s = max(1, max(len(h) for h in cut))
    idx = np.zeros((len(cut), s), dtype=np.int64)
    lengths = np.zeros(len(cut), dtype=np.int64)
    for i, h in enumerate(cut):
        idx[i, : len(h)] = h
        lengths[i] = len(h)
    return sid_table[torch.from_numpy(idx)], torch.from_numpy(lengths)


def set_determinism(seed: int, threads: int | None = None) -> None:
    """Seed torch and make it use deterministic kernels (and a fixed thread count, if given)."""
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    if threads:
        torch.set_num_threads(int(threads))


def train_model(
    sequences: Sequence[np.ndarray],
    sids: np.ndarray,
    codebook_sizes: Sequence[int],
    cfg: ModelConfig,
    *,
    progress: Progress = NULL_PROGRESS,
    log: Callable[[str], None] | None = None,
) -> TigerLike:
    """Train on the users' item sequences (indices into `sids` int [I, L]); returns the model in eval mode."""
    set_determinism(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    model = TigerLike(codebook_sizes, cfg)
    sid_table = torch.as_tensor(np.asarray(sids, dtype=np.int64))
    windows = _windows(sequences, cfg.max_history)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = (len(windows) + cfg.batch_windows - 1) // cfg.batch_windows
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.lr, total_steps=max(1, cfg.epochs * steps_per_epoch), pct_start=0.1
    )
    progress.stage("train", cfg.epochs * steps_per_epoch)
    model.train()
    for epoch in range(cfg.epochs):
        started, total_loss, total_targets = time.perf_counter(), 0.0, 0
        chosen = rng.permutation(len(windows))
        for b in range(steps_per_epoch):
            batch = [windows[i] for i in chosen[b * cfg.batch_windows : (b + 1) * cfg.batch_windows]]
            loss, n = _batch_loss(model, batch, sid_table)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total_loss += float(loss.detach()) * n
            total_targets += n
            progress.advance(1)
        if log is not None:
            log(
                f"epoch {epoch + 1}/{cfg.epochs}: loss {total_loss / max(total_targets, 1):.4f} "
                f"({time.perf_counter() - started:.1f} s)"
            )
    model.eval()
    return model


def _batch_loss(model: TigerLike, batch: list[np.ndarray], sid_table: torch.Tensor):
    """Mean cross-entropy over every (target item, step) of a batch of windows; returns (loss, targets)."""
    history, lengths = _pad_histories([w[:-1] for w in batch], model.cfg.max_history, sid_table)
    memory = model.encode(history, lengths)  # [B, S, d]
    s = history.shape[1]
    # Block j of window b decodes item j+1 (teacher forcing) and sees encoder states 0..j.
    target_idx = np.zeros((len(batch), s), dtype=np.int64)
    for i, w in enumerate(batch):
        target_idx[i, : len(w) - 1] = w[1:]
    targets = sid_table[torch.from_numpy(target_idx)]  # [B, S, L]
    memory_pad = torch.arange(s)[None, :] >= lengths[:, None]
    hidden = model.decode(targets[..., :-1], memory, memory_pad, causal_memory=True)  # [B, S, L, d]
    real = ~memory_pad  # block j is a real target iff history position j is real
    hidden, targets = hidden[real], targets[real]  # [K, L, d], [K, L]
    loss = sum(
        nn.functional.cross_entropy(head(hidden[:, t]), targets[:, t]) for t, head in enumerate(model.heads)
    )
    return loss / model.num_steps, int(real.sum())


class RequestEncoder:
    """Encoder states for a batch of requests, and the Decoder's `step_fn` over them.

    step_fn(step, prefixes int64 [R, step], batch int64 [R]) -> hidden float32 [R, d], where batch[r] is the
    request (row of `histories`) that beam r belongs to. Runs under torch.no_grad on CPU.
    """

    def __init__(self, model: TigerLike, histories: Sequence[np.ndarray], sids: np.ndarray):
        self.model = model
        sid_table = torch.as_tensor(np.asarray(sids, dtype=np.int64))
        history, lengths = _pad_histories(histories, model.cfg.max_history, sid_table)
        with torch.no_grad():
            self.memory = model.encode(history, lengths)
        self.memory_pad = torch.arange(history.shape[1])[None, :] >= lengths[:, None]

    def step_fn(self, step: int, prefixes: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """Hidden float32 [R, d] for beams with prefixes int64 [R, step] of requests batch int64 [R]."""
        batch = batch.to("cpu", torch.int64)
        prefixes = prefixes.to("cpu", torch.int64)
        r = prefixes.shape[0]
        counts = torch.bincount(batch, minlength=1)
        order = torch.argsort(batch, stable=True)
        with torch.no_grad():
            if r and bool((counts[counts > 0] == counts.max()).all()):
                # Every request has the same number of beams: pack them per request (one memory row each).
                reqs = batch[order].reshape(-1, int(counts.max()))[:, 0]
                packed = prefixes[order].reshape(len(reqs), int(counts.max()), -1)
                hidden = self.model.decode(packed, self.memory[reqs], self.memory_pad[reqs])
                out = torch.empty(r, hidden.shape[-1])
                out[order] = hidden[:, :, -1].reshape(r, -1)
                return out
            hidden = self.model.decode(prefixes[:, None], self.memory[batch], self.memory_pad[batch])
            return hidden[:, 0, -1]
