"""Tests of tools/result_files.py: how a page names a list of seeds."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import result_files  # noqa: E402


def test_seeds_render_as_a_range_a_list_or_one_seed():
    assert result_files.seed_range([1, 2, 3]) == "1-3"
    assert result_files.seed_range([1, 3]) == "1, 3"
    assert result_files.seed_range([2]) == "2"
