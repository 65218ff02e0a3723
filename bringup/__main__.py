"""``python -m bringup``: see bringup.cli."""

import sys

from .cli import main

sys.exit(main())
