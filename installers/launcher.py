"""The frozen bundle's entry script (PyInstaller runs this as __main__)."""

import multiprocessing
import sys

from lazykv.__main__ import main

# a spawned worker (the model library's download process) starts this same binary: run the worker, not the app
multiprocessing.freeze_support()
sys.exit(main())
