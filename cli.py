"""Run zerogr from a checkout: `python cli.py build catalog.parquet` (same as the `zerogr` command)."""

from zerogr_build.cli import main

if __name__ == "__main__":
    main()
