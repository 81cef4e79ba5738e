import sys

from psbench.bench.cli import main

sys.exit(main())
