"""The cross-image diff: versions, stage and build results, kernel dumps element-wise, e2e
token divergences (near-tie or real) and fallback lists of every image against a reference.

    from bringup.diff import run_diff
    code = run_diff(Path("artifacts"), ["flagtree", "vendor"], "local", near_tie_margin=0.5)
"""

from bringup.diff.collect import DiffResult, collect
from bringup.diff.run import default_images, run_diff

__all__ = ["DiffResult", "collect", "default_images", "run_diff"]
