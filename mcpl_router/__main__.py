import sys

from mcpl_router.cli import main

sys.exit(main())
