"""`python -m memstream`, and the `memstream` console script (`console`)."""

import signal
import sys


def console() -> int:
    """Run the command line. While its modules load (a second or more on a busy machine), Ctrl-C ends the process
    as the signal does, quietly (the shell reports 130), instead of a traceback out of some import; from then on
    Python's handler is back and `main` turns Ctrl-C into one line and exit 130."""
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    from memstream.cli import main

    signal.signal(signal.SIGINT, previous)
    return main()


if __name__ == "__main__":
    sys.exit(console())
