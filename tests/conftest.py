"""Put the repository root on sys.path, so that tests import the scripts as modules."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
