"""Parses every .sql file in the given directories as T-SQL with sqlglot (tsql dialect).

Used by the MS SQL backend's tests (`every_statement_parses_as_tsql`): the statement files and
snapshots beside this script, the migrations under migrations/mssql and the procedure files under
migrations/mssql/procedures. Fails (exit 1) on a syntax error, on any statement sqlglot only
accepts as an opaque Command (its fallback for syntax it does not model), since such a statement
was not really checked, and on a file with no statement, unless it holds comments alone (a
migration emptied of the procedures it used to create). Prints `ok NAME` per parsed file.
"""

import logging
import re
import sys
from pathlib import Path

import sqlglot
from sqlglot import exp


class FallbackDetector(logging.Handler):
    """sqlglot logs a warning when it falls back to parsing a statement as a Command."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def comments_only(text):
    """Whether every line is blank or a `--` comment."""
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())


# sqlglot does not model CREATE TRIGGER: a trigger's body is checked as the body of a procedure
# of the same name (its header is what the procedures' own test checks, and the migrator runs).
TRIGGER_HEADER = re.compile(r"(?m)^CREATE TRIGGER (\S+) ON \S+ AFTER [A-Z, ]+ AS$")


def check(path, detector):
    detector.messages.clear()
    text = TRIGGER_HEADER.sub(r"CREATE PROCEDURE \1 AS", path.read_text(encoding="utf-8"))
    # A migration's batches are separated by lines holding only GO, as SQL Server's tools
    # (and the migration runner) split them; GO itself is not T-SQL.
    batches = re.split(r"(?im)^[ \t]*GO[ \t]*$", text)
    trees = []
    try:
        for batch in batches:
            trees += sqlglot.parse(batch, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    except sqlglot.errors.ParseError as e:
        return [f"syntax error: {e}"]
    problems = [f"not parsed (fallback): {m}" for m in detector.messages]
    statements = 0
    for tree in trees:
        if tree is None:
            continue
        for node in tree.walk():
            if isinstance(node, exp.Command):
                problems.append(f"opaque command: {node.sql(dialect='tsql')[:200]}")
        statements += 1
    if statements == 0 and not comments_only(text):
        problems.append("no statement found")
    return problems


def main(dirs):
    detector = FallbackDetector()
    logging.getLogger("sqlglot").addHandler(detector)
    failed = False
    files = sorted(p for d in dirs for p in Path(d).glob("*.sql"))
    if not files:
        print("no .sql files found in", dirs)
        return 1
    for path in files:
        problems = check(path, detector)
        if problems:
            failed = True
            print(f"FAIL {path.name}")
            for problem in problems:
                print(f"    {problem}")
        else:
            print(f"ok {path.name}")
    print(f"sqlglot {sqlglot.__version__}: {len(files)} files")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
