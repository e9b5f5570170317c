import sys

from aiayn.cli import main

sys.exit(main())
