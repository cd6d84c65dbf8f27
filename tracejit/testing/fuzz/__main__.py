import sys

from tracejit.testing.fuzz.cli import main

sys.exit(main())
