"""The agent<->worker contract: every file, variable, request and answer an agent and
its workers exchange, with their encodings, defined once and imported by both sides
(agent/ on one, core/worker/ on the other). Pure: names, records and their checked
decoding; the files are read and written by each side.

repair_files.py: the control files of repair in place (state, request, resume).
"""
