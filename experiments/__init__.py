"""Research beside the product, not part of the zerogr wheel: the MovieLens quality reproductions.

    movielens/          datasets, SIDs, the model families and their training loop, the run glue
    quality_ml100k.py   MovieLens-100K: filter-first vs score-first through a small TIGER-like model
    quality_ml1m.py     MovieLens-1M at convergence: T5 and GPT-2 families through the HF integration

Run from the repository root with zerogr installed, e.g. `python -m experiments.quality_ml100k --help`.
They use only zerogr_build's public modules; nothing in zerogr_build imports them.
"""
