"""Repair in place, the worker's side: rtrain.repairable and what it rests on.

repairable.py (the training function re-entered in each generation; the control
files it exchanges with its agent are core/contract/repair_files.py), asked.py (ASKED:
the repair request, seen by waits that are not collectives), group.py (the
generation's process groups, opened by rtrain and released while a collective may be
blocked in them), group_sockets.py (a process's sockets, listed and shut down one by
one), group_registry.py (the sockets of every group opened in a generation; torch's
private group-creation helper, version-checked) and mesh_caches.py (DTensor's caches of
a destroyed generation's meshes, dropped; torch's private caches, version-checked).
"""

from .repairable import RepairError, repairable, repairs

__all__ = ["RepairError", "repairable", "repairs"]
