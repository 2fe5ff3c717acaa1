"""Reading a Parquet file someone else chose (a vLLM request's availability file) with caps: a file whose
footer states more rows than allowed, whose pages take more bytes uncompressed, or whose values decode to
more bytes, is refused with one line before its values are decoded; files within the caps read as before."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zerogr_build.base.errors import InputError
from zerogr_build.runtime.items.files import MAX_FOOTER_BYTES, parquet_footer_rows, read_available_ids


def test_footer_rows_are_read_before_any_page(tmp_path):
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"item_id": pa.array([7] * 200_000, pa.int64())}), path, row_group_size=50_000)
    assert path.stat().st_size < 10_000  # run-length encoded: 200k rows in a few KB
    fd = os.open(path, os.O_RDONLY)
    try:
        assert parquet_footer_rows(fd, "many") == 200_000
    finally:
        os.close(fd)
    with pytest.raises(InputError, match="200000 rows, more than 1000"):
        read_available_ids(path, max_rows=1000, max_bytes=1 << 20)
    ids, _ = read_available_ids(path)  # no caps: the CLI's own files read as before
    assert len(ids) == 200_000


def test_a_footer_over_the_cap_is_not_parsed(tmp_path):
    path = tmp_path / "footer.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 16 + (MAX_FOOTER_BYTES + 1).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(InputError, match="a footer of"):
        read_available_ids(path, max_rows=10, max_bytes=1 << 20)


@pytest.mark.parametrize("dictionary", [True, False])
def test_text_ids_that_decode_past_the_cap_are_refused(tmp_path, dictionary):
    """100 rows of one 100 kB id: a small file either way (dictionary-encoded, or plain and zstd), 10 MB of
    values decoded."""
    path = tmp_path / "wide.parquet"
    table = pa.table({"item_id": pa.array(["x" * 100_000] * 100, pa.string())})
    pq.write_table(table, path, use_dictionary=dictionary, compression="zstd")
    assert path.stat().st_size < 50_000
    with pytest.raises(InputError, match="more than 1000000"):
        read_available_ids(path, max_rows=1000, max_bytes=1_000_000)
    ids, _ = read_available_ids(path, max_rows=1000, max_bytes=20_000_000)
    assert len(ids) == 100 and ids[0].as_py() == "x" * 100_000 and not pa.types.is_dictionary(ids.type)


def test_capped_reads_give_the_same_ids(tmp_path):
    path = tmp_path / "flags.parquet"
    pq.write_table(pa.table({"item_id": ["a", "b", "c"], "ok": [True, False, True]}), path)
    assert read_available_ids(path, max_rows=3, max_bytes=1000)[0].to_pylist() == ["a", "c"]
    assert read_available_ids(path)[0].to_pylist() == ["a", "c"]
