"""Put the repository root on sys.path, so that tests import the scripts as modules, and give JAX's
CPU backend two devices whatever the machine, so the data-parallel paths always run."""

import os
import sys

os.environ["JAX_NUM_CPU_DEVICES"] = "2"  # before JAX starts; inherited by the scripts' subprocesses

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
