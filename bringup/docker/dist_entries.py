"""The top-level entries of a site-packages folder that hold the files of the named distributions.

Run by another image's own Python (``python3 -c <this file's text> FOLDER NAME...``), so it needs
nothing but the standard library of any Python 3: it prints a JSON list of the folder's entries
(each matching ``*.dist-info`` folder and the first part of each RECORD row that stays inside the
folder), sorted. A name with no distribution in the folder adds nothing.
"""

import csv
import json
import os
import re
import sys


def normalized(name):
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(folder, names):
    wanted = {normalized(n) for n in names}
    found = set()
    for info in os.listdir(folder):
        if not info.endswith(".dist-info") or normalized(info[: -len(".dist-info")].rpartition("-")[0]) not in wanted:
            continue
        found.add(info)
        record = os.path.join(folder, info, "RECORD")
        if not os.path.isfile(record):
            continue
        with open(record, newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                first = row[0].replace("\\", "/").split("/")[0] if row and row[0] else ""
                if first and first not in (".", "..") and os.path.lexists(os.path.join(folder, first)):
                    found.add(first)
    return sorted(found)


if __name__ == "__main__":
    print(json.dumps(entries(sys.argv[1], sys.argv[2:])))
