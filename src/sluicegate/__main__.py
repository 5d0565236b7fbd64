import sys

from sluicegate.cli import main

sys.exit(main())
