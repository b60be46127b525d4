"""The agent<->worker contract: every file, variable, request and answer an agent and
its workers exchange, with their encodings, defined once and imported by both sides
(agent/ on one, core/worker/ on the other). Pure: names, records and their checked
decoding; the files are read and written by each side.

environment.py: the variables an agent sets for its workers beyond torchrun's, and the
  heartbeat file's layout.
repair_files.py: the control files of repair in place (state, request, resume).
peer_shards.py: other ranks' shards asked of the agent (request, answer, file names).
dcp_index.py: the index a torch.distributed.checkpoint save writes into every shard,
  read back by the workers' loads and the agents' prefetch.
The slots' layout (header, skeleton, checksums) is core/snapshots/format.py's.
"""
