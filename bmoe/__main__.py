import sys

from bmoe.cli import main

sys.exit(main())
