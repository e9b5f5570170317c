import sys

from aiayn.cli import main

if __name__ == "__main__":  # not when a worker process is spawned (aiayn.serve.workers)
    sys.exit(main())
