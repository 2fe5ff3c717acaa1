"""`python -m zerogr_build.cli ...`, the same as the `zerogr` command."""

from . import main

main()
