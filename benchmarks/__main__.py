"""``python -m benchmarks``: run every benchmark family (see :mod:`benchmarks.suite`)."""

import sys

from .suite import main

sys.exit(main())
