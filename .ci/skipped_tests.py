"""Print the pytest node ids of the tests a JUnit XML report records as skipped, one per line.

Usage: python3 .ci/skipped_tests.py REPORT.xml [ROOT]   (ROOT: the checkout the ids are relative to)

CI runs the suite in a fresh container (no docker daemon, no C++ compiler) with a JUnit report,
then runs on the CI host exactly the tests the container skipped. A test's id is rebuilt from
the report's ``classname`` (``tests.test_x`` or ``tests.test_x.TestY``) and ``name``
(``test_z[param]``): the longest dotted prefix that names a ``.py`` file under ROOT is the module
(a module skipped whole: an empty classname, the dotted module as the name).
Exits 2 when the report is unreadable or a classname matches no file.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def node_id(classname: str, name: str, root: Path) -> str:
    """A module skipped whole is recorded with an empty classname and the module as its name."""
    parts, rest = (classname.split("."), [name]) if classname else (name.split("."), [])
    for cut in range(len(parts), 0, -1):
        module = Path(*parts[:cut]).with_suffix(".py")
        if (root / module).is_file():
            return "::".join([module.as_posix(), *parts[cut:], *rest])
    raise ValueError(f"test {classname or name!r} names no .py file under {root}")


def skipped_ids(report: Path, root: Path) -> list[str]:
    cases = ET.parse(report).getroot().iter("testcase")
    return [node_id(case.get("classname", ""), case.get("name", ""), root) for case in cases if case.find("skipped") is not None]


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    try:
        ids = skipped_ids(Path(argv[0]), Path(argv[1] if len(argv) == 2 else "."))
    except (OSError, ET.ParseError, ValueError) as exc:
        print(f"error: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
