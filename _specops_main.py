"""The `specops` console script. Importing specops (torch, numpy, the compiled ops) takes a second
or two, and a Ctrl-C in that time would raise KeyboardInterrupt inside that import, before
specops.cli.run could catch it: a traceback, or worse, since a C extension's module init
(numpy's) may swallow the exception and carry on (the run then ignored the Ctrl-C and went to
its end) or leave a half-imported module behind (an ImportError). So while specops imports, a
Ctrl-C ends the process at once, raising nothing through the import machinery."""

import os
import signal
import sys


def _interrupted(signum, frame) -> None:
    try:
        print("\ninterrupted", file=sys.stderr, flush=True)
    finally:   # even when stderr cannot be written (its reader gone): nothing may raise here
        os._exit(130)


def main() -> None:
    # a process started in the background (`cmd &` in a script) ignores SIGINT: it stays ignored
    catch = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if catch:
        signal.signal(signal.SIGINT, _interrupted)
    try:
        from specops.cli import run
    finally:
        if catch:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    run()
