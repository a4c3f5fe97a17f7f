"""The caching allocator replay follows c10/cuda/CUDACachingAllocator.cpp's rules."""

import numpy as np
import pytest
import torch.nn as nn

from dippm_nas import build_graph
from dippm_nas.cost.pipeline.allocator import MIB, CachingAllocator, replay
from dippm_nas.cost.pipeline.memory import memory, transient_bytes
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.precisions import PRECISIONS


def test_small_requests_share_two_mib_segments():
    a = CachingAllocator()
    blocks = [a.malloc(1000) for _ in range(4096)]  # 4096 x 1024 bytes (rounded to 512) = 4 MiB
    assert a.reserved == 4 * MIB and a.allocated == 4 * MIB
    assert {b.size for b in blocks} == {1024}


def test_mid_sized_requests_split_a_20_mib_segment():
    a = CachingAllocator()
    for _ in range(4):
        a.malloc(5 * MIB)
    assert a.reserved == 20 * MIB
    a.malloc(5 * MIB)
    assert a.reserved == 40 * MIB


def test_large_request_gets_its_own_segment_rounded_to_two_mib():
    a = CachingAllocator()
    a.malloc(15 * MIB + 1)
    assert a.reserved == 16 * MIB


def test_remainder_of_one_mib_or_less_is_not_split_off():
    a = CachingAllocator()
    block = a.malloc(19.5 * MIB)  # a 20 MiB segment (rounded up): nothing to split
    a.free(block)
    again = a.malloc(12 * MIB)  # best fit is that 20 MiB block; 8 MiB is split off
    assert again.size == 12 * MIB and a.reserved == 20 * MIB
    last = a.malloc(7.5 * MIB)  # 0.5 MiB would remain: it gets the whole 8 MiB
    assert last.size == 8 * MIB and a.allocated == 20 * MIB


def test_free_blocks_of_one_segment_merge_but_segments_never_do():
    a = CachingAllocator()
    first, second = a.malloc(12 * MIB), a.malloc(12 * MIB)  # two segments of 12 MiB
    a.free(first)
    a.free(second)
    a.malloc(14 * MIB)  # neither free block fits and they are not adjacent: a third segment
    assert a.reserved == 38 * MIB and a.peak_reserved == 38 * MIB
    b = CachingAllocator()
    quarters = [b.malloc(5 * MIB) for _ in range(4)]
    b.free(quarters[1])
    b.free(quarters[2])  # merges with its free neighbour: 10 MiB in one block
    b.malloc(9 * MIB)
    assert b.reserved == 20 * MIB


def test_replay_frees_each_output_after_its_last_reader():
    # a chain of three 12 MiB outputs, each read only by the next: two are live at a time, and the
    # third reuses the first's segment
    outputs = np.full(3, 12.0 * MIB)
    free_step = np.array([1, 2, 3])
    none = np.zeros(3)
    a = replay([], outputs, free_step, none, none)
    assert a.peak_reserved == 24 * MIB
    # a workspace the size of two outputs while the second runs: another segment
    a = replay([], outputs, free_step, none, np.array([0.0, 24 * MIB, 0.0]))
    assert a.peak_reserved == 48 * MIB
    # the third operator's cast copy (10 MiB) comes before its output and takes the first output's
    # freed segment, so the output needs a segment of its own; a 10 MiB workspace comes after it
    ten = np.array([0.0, 0.0, 10 * MIB])
    assert replay([], outputs, free_step, ten, none).peak_reserved == 36 * MIB
    assert replay([], outputs, free_step, none, ten).peak_reserved == 34 * MIB


def test_a_workspace_of_several_tensors_is_replayed_tensor_by_tensor():
    # math attention's scores, softmax and mask are tensors of their own: the next attention's fit
    # in the segments the last one's left behind, where their sum as one block would need a new one
    outputs, free_step = np.zeros(2), np.full(2, -1)
    none = np.zeros((2, 1))
    rows = np.full((2, 2), 12.0 * MIB)
    assert replay([], outputs, free_step, none, rows).peak_reserved == 24 * MIB
    lumped = np.array([[12.0 * MIB, 12.0 * MIB], [24.0 * MIB, 0.0]])
    assert replay([], outputs, free_step, none, lumped).peak_reserved == 48 * MIB
    # cast copies likewise: two 12 MiB copies fit where the two 12 MiB tensors of a workspace were
    assert replay([], outputs, free_step, rows[::-1] * [[0, 0], [1, 1]], rows * [[1, 1], [0, 0]]
                  ).peak_reserved == 24 * MIB


@pytest.mark.parametrize("batch", [1, 64])
def test_memory_is_context_plus_the_replayed_peak(batch):
    mlp = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
    table = node_table(build_graph(mlp, (1024,), batch=batch))
    m = memory(table, PRECISIONS["fp16"])
    live = m.weights_mib + m.activations_mib + m.workspace_mib
    assert m.allocator_mib >= 0
    replayed = replay([32 * MIB, *table.weight_tensor_bytes.tolist(), table.input_bytes], table.allocations(2),
                      table.free_step, *transient_bytes(table, PRECISIONS["fp16"])).peak_reserved / MIB
    assert live + m.allocator_mib == pytest.approx(max(replayed, live))
    # the workspace (32 MiB) and the two weights (16 MiB) in segments of their own, the biases and the
    # activations in one 2 MiB small segment, each layer's 8 MiB half copy in one 20 MiB segment
    assert m.context_and_reserved_mib - m.context_mib == pytest.approx(32 + 2 * 16 + 2 + 20)



def test_reserving_resident_tensors_is_malloc_for_each():
    # weights and inputs of many sizes in both pools, then a forward pass's allocations and frees:
    # the fast path leaves the allocator in the state one malloc per tensor leaves it in
    rng = np.random.default_rng(0)
    sizes = rng.choice([300.0, 4096.0, 0.7 * MIB, 3 * MIB, 12 * MIB], 300) * rng.uniform(0.5, 1.5, 300)
    resident = [0.0, *sizes.tolist()]
    fast, slow = CachingAllocator(), CachingAllocator()
    fast.reserve(resident)
    for nbytes in resident:
        if nbytes > 0:
            slow.malloc(nbytes)
    requests = (rng.choice([256.0, 8192.0, 0.9 * MIB, 5 * MIB, 30 * MIB], 400) * rng.uniform(0.5, 1.5, 400)).tolist()
    for allocator in (fast, slow):
        live, order = [], np.random.default_rng(1)  # the same frees in the same order for both
        for i, nbytes in enumerate(requests):
            live.append(allocator.malloc(nbytes))
            if i % 3 == 2:
                allocator.free(live.pop(int(order.integers(len(live)))))
    state = [(a.peak_reserved, a.peak_allocated, a.reserved, a.allocated, a._segments,
              {small: [key[:3] for key in pool] for small, pool in a._pools.items()}) for a in (fast, slow)]
    assert state[0] == state[1]
    assert fast.peak_reserved > 100 * MIB  # the sequence did reach both pools' segments
    with pytest.raises(RuntimeError, match="nothing was allocated"):
        fast.reserve([1.0])
