"""Slow ranks: their figures as the agents share them (figures.py) and which ranks are
stragglers (detect.py). Pure (issue 49; docs/stragglers.md)."""
