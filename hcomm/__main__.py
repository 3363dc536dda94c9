import sys

from hcomm.cli import main

sys.exit(main())
