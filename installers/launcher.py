"""The frozen bundle's entry script (PyInstaller runs this as __main__)."""

import sys

from lazykv.__main__ import main

sys.exit(main())
