"""Reader of the documented API table, tests/data/api.tsv (one row per ``K`` function)."""

import os

API_TSV = os.path.join(os.path.dirname(__file__), "data", "api.tsv")


def read_rows(path=API_TSV):
    """The table's (name, signature) rows, in file order."""
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0].split("\t")[:2] == ["name", "signature"]
    return [line.split("\t")[:2] for line in lines[1:] if line.strip()]


ROWS = read_rows()
