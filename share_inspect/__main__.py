"""`python -m share_inspect`: the same as `kubectl inspect gpushare`."""

import sys

from share_inspect.cli import main

sys.exit(main())
