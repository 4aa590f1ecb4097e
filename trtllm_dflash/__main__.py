import sys

from trtllm_dflash.cli import main

sys.exit(main())
