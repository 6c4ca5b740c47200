"""`python -m share_plugin` runs the same entry point as the `share-plugin` console script."""

from share_plugin.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
