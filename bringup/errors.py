"""The one error type for bad configuration (matrix.yaml, recipes, image recipes).

Every task catches :class:`ConfigError`, prints ``error: <message>`` to stderr and exits 2,
without a traceback.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration file is unusable.

    The message is ONE line: the file, the key path (e.g. ``images.flagtree.expect.torch``)
    and what was expected there.
    """

    EXIT_CODE = 2
