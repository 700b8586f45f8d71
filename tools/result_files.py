"""The committed results in results/, as the docs' tables (tools/make_tables.py) and
figures (tools/figures.py) read them: a result file by its path there, and a list of seeds as
a page names it. Both import this module; neither imports the other's pieces."""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = "results"


def load(path: str) -> dict:
    with open(os.path.join(ROOT, RESULTS, path)) as f:
        return json.load(f)


def seed_range(seeds: list[int]) -> str:
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))
