import sys

from lumotree.cli import main

sys.exit(main())
