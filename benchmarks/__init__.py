"""Yardsticks that zerogr is measured against, importable by the tests and the benchmark scripts.

Not part of the zerogr package (not installed, not imported by zerogr_build): a reference port of someone
else's code belongs beside the measurements, not in the product.

    static_baseline   Google STATIC's index build, ported to numpy (tests/test_static_layout.py and
                      scripts/bench_build.py)
    static_search     Google STATIC's torch beam search (decoding_pt.py), ported (scripts/bench_decode.py)
"""
