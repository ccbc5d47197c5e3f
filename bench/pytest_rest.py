"""The test ids a cut pytest run did not reach, so that the next device call runs only those.

    python bench/pytest_rest.py LOG [PYTEST_ARGS ...]      # prints the ids left, one per line

LOG is the earlier run's `pytest -v` output (bench/gpu_check.sh's pytest.log, with or without
pytest-xdist's "[gw3] [ 12%]" prefixes); PYTEST_ARGS (default: tests) are collected again with
`pytest --collect-only -q`, and every id the log reports with an outcome (passed, failed,
skipped, error, xfail, xpass) is dropped. gpu_check.sh runs it under TESTS_AFTER=LOG. A test
that the cut run had started but not finished is left, so it runs again.
"""

from __future__ import annotations

import re
import subprocess
import sys

OUTCOMES = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
# xdist -v: "[gw3] [ 12%] PASSED tests/a.py::t[x]"; plain -v: "tests/a.py::t[x] PASSED   [ 12%]".
# A parametrised id may hold spaces ("t[Using the ops]"): xdist's id runs to the end of its line,
# plain -v's up to the first outcome word after it.
_OUTCOME_FIRST = re.compile(rf"(?:^|\s)(?:{OUTCOMES}) (\S+::.*?)\s*$", re.M)
_ID_FIRST = re.compile(rf"^(\S+::.*?) (?:{OUTCOMES})\b", re.M)


def reported_ids(log_text: str) -> set[str]:
    """The test ids that `log_text` (pytest -v output) reports with an outcome."""
    return set(_OUTCOME_FIRST.findall(log_text)) | set(_ID_FIRST.findall(log_text))


def remaining(collected: list[str], log_text: str) -> list[str]:
    """The ids of `collected` (in their order) that `log_text` does not report."""
    done = reported_ids(log_text)
    return [i for i in collected if i not in done]


def collect(args: list[str]) -> list[str]:
    """The test ids pytest collects for `args`."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         capture_output=True, text=True)
    ids = [ln.strip() for ln in out.stdout.splitlines() if "::" in ln]
    if out.returncode not in (0, 5):            # 5: nothing collected
        raise SystemExit(f"pytest_rest: collecting {args} failed (rc {out.returncode}):\n{out.stdout[-2000:]}"
                         f"{out.stderr[-2000:]}")
    return ids


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], errors="replace") as f:
        log_text = f.read()
    collected = collect(argv[1:] or ["tests"])
    rest = remaining(collected, log_text)
    print(f"pytest_rest: {len(collected)} collected, {len(collected) - len(rest)} reported in {argv[0]}, "
          f"{len(rest)} left", file=sys.stderr)
    print("\n".join(rest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
