"""A resharding load's chunks read from another rank's shard file (core/worker/dcp/
chunks.py, core/worker/peer_shards.py ShardFile): preadv straight into the target, the
same bytes a copy out of the whole tensor gives, for every chunk shape."""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from rtrain.core.snapshots.format import SnapshotError, plan_shard, write_shard
from rtrain.core.worker.dcp.chunks import byte_span, read_chunk
from rtrain.core.worker.peer_shards import ShardFile

SAVED = {
    "rows": torch.arange(7 * 5 * 3, dtype=torch.float32).reshape(7, 5, 3),
    "half": torch.arange(40, dtype=torch.bfloat16).reshape(8, 5),
    "step": torch.tensor(12.0),
}


@pytest.fixture
def shard(tmp_path) -> ShardFile:
    layout = plan_shard({"items": SAVED})
    data = bytearray(layout.size)
    write_shard(data, layout, 3)
    path = tmp_path / "prefetched-r1-s3.shard"
    path.write_bytes(data)
    opened = ShardFile(str(path))
    os.remove(path)  # the descriptor keeps it, as a fetched file removed at once
    yield opened
    opened.close()


def chunks(shape: tuple[int, ...]):
    """Every (starts, lengths) of a small tensor of `shape`."""
    ranges = [[(s, n) for s in range(size + 1) for n in range(size - s + 1)] for size in shape]
    for picked in itertools.product(*ranges):
        yield tuple(p[0] for p in picked), tuple(p[1] for p in picked)


@pytest.mark.parametrize("name", ["rows", "half", "step"])
def test_every_chunk_reads_the_bytes_a_copy_of_the_tensor_gives(shard, name) -> None:
    saved, ref = SAVED[name], shard.skeleton["items"][name]
    for starts, lengths in chunks(tuple(saved.shape)):
        expected = saved
        for dim, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            expected = expected.narrow(dim, start, length)
        for target in (
            torch.full(lengths, -1.0, dtype=saved.dtype),  # contiguous: preadv into it
            torch.full(lengths[::-1], -1.0, dtype=saved.dtype).permute(
                tuple(reversed(range(len(lengths))))
            ),  # strided: through a buffer
            torch.full(lengths, -1.0, dtype=torch.float64),  # another dtype
        ):
            read_chunk(shard, ref, starts, lengths, target, name)
            assert torch.equal(target, expected.to(target.dtype)), (name, starts, lengths)


def test_contiguous_spans_are_found_and_others_are_not() -> None:
    assert byte_span((7, 5, 3), (2, 0, 0), (3, 5, 3), 4) == (2 * 15 * 4, 3 * 15 * 4)
    assert byte_span((7, 5, 3), (2, 1, 0), (1, 2, 3), 4) == ((2 * 15 + 3) * 4, 6 * 4)
    assert byte_span((7, 5, 3), (2, 1, 0), (2, 2, 3), 4) is None
    assert byte_span((), (), (), 8) == (0, 8)


def test_a_chunk_outside_its_tensor_or_unlike_its_target_is_refused(shard) -> None:
    ref = shard.skeleton["items"]["rows"]
    with pytest.raises(SnapshotError, match="does not lie inside"):
        read_chunk(shard, ref, (5, 0, 0), (3, 5, 3), torch.empty(3, 5, 3), "rows")
    with pytest.raises(SnapshotError, match="for a target of"):
        read_chunk(shard, ref, (0, 0, 0), (3, 5, 3), torch.empty(3, 5, 2), "rows")
    with pytest.raises(SnapshotError, match="missing"):
        read_chunk(shard, 12, (0,), (1,), torch.empty(1), "rows")


def test_a_truncated_or_empty_file_is_refused(tmp_path) -> None:
    layout = plan_shard({"items": SAVED})
    data = bytearray(layout.size)
    write_shard(data, layout, 3)
    short = tmp_path / "short.shard"
    short.write_bytes(data[: layout.size // 2])
    with pytest.raises(SnapshotError, match="truncated"):
        ShardFile(str(short))
    empty = tmp_path / "empty.shard"
    empty.write_bytes(b"")
    with pytest.raises(SnapshotError, match="empty"):
        ShardFile(str(empty))
