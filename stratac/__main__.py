"""`python -m stratac`: the same command line as the `stratac` script (stratac.cli)."""

import sys

from stratac.cli import main

sys.exit(main())
