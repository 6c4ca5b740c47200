"""`python -m share_dra` runs the same entry point as the `share-dra` console script."""

from share_dra.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
