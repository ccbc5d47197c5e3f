"""The `specops` console script. Importing specops (torch, the compiled ops) takes a second or two;
a Ctrl-C in that time would print a KeyboardInterrupt traceback from the import, before
specops.cli.run could catch it, so this module, which imports nothing heavy, catches it first."""

import os
import sys


def main() -> None:
    try:
        from specops.cli import run
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr, flush=True)
        os._exit(130)
    run()
