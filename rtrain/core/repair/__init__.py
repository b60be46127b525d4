"""Repair in place, decided: pure functions of what the agent observed and the time it
gives them (decisions.py); agent/repair/ observes and carries them out."""
