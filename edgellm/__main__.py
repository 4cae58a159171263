import sys

from edgellm.cli.commands import main

sys.exit(main())
