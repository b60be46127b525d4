"""A script that sets its own thread counts before it imports torch, as users do
(issue 47): OMP_NUM_THREADS=2 in its environment, then torch's inter-op setter. Writes
what torch then has to <out>/threads_rank<R>.json."""

import os

os.environ["OMP_NUM_THREADS"] = "2"

import argparse
import json

import torch

torch.set_num_interop_threads(2)
parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
out = parser.parse_args().out
torch.ones(256, 256) @ torch.ones(256, 256)  # parallel work: the counts are in use
found = {"intra": torch.get_num_threads(), "inter": torch.get_num_interop_threads()}
with open(os.path.join(out, f"threads_rank{os.environ['RANK']}.json"), "w") as handle:
    json.dump(found, handle)
