import sys

from share_webhook.cli import main

sys.exit(main())
