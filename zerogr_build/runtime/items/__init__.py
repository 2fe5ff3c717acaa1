"""Item constraints at serve time (docs/constraints.md): what a user builds, and how the Decoder applies it.

    constraints.py  ItemMask, ItemSets: the public objects (torch-free; zerogr_build exports both)
    ids.py          item ids by value in the catalog's type, bindings to one item order, id -> position lookup
    files.py        availability and item-set Parquet files, read strictly
    space.py        per mask / sets: the Decoder's resident state (set_availability, set_item_sets)
    requests.py     per search: include / exclude compiled against that state; kills.py: the rows they empty
    filter.py       per step: how the Decoder's steps apply both, on its device

This package imports nothing itself: `constraints`, `ids` and `files` need no torch; the rest do.
"""
