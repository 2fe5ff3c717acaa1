"""Quality reproduction helpers: does filter-first decoding change a real recommender's top-K?

Library code behind `scripts/quality_ml100k.py` and `zerogr compare`:
    data     MovieLens-100K from the recbole 1.2.1 wheel (recbole atomic-file format), leave-one-out split
    sids     item embeddings -> residual k-means semantic IDs (+ a collision-resolving last token)
    model    a small TIGER-like encoder/decoder over SID tokens (torch), trained on CPU
    run      the glue: dataset -> SIDs -> catalog -> bundle -> model -> a `zerogr compare` model function
The metrics live in zerogr_build.compare.metrics: quality uses compare, never the reverse.

Nothing here imports torch at module load except `model` (imported lazily by its users).
"""
