"""Data movement: concatenation, padding, gathers and scatters, resizing, copies into a new layout,
tensors made from nothing. No arithmetic; memory-bound."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dippm_nas.graph import eager_layout
from dippm_nas.graph.operators import _rules
from dippm_nas.graph.operators._registry import Node, declare_category, register, register_relax, spell_aten
from dippm_nas.graph.tensor import Shape, Tensor

if TYPE_CHECKING:
    import torch


MOVEMENT = declare_category("movement")

#: The operator a copy eager makes where a view is impossible is: ATen's clone, a transform into a new
#: (contiguous) layout. TVM reads clone as the identity; eager's clone copies.
COPY_OP = "clone.default"

#: ATen's bilinear and bicubic upsampling of an NCHW input (``upsample_bilinear2d_out_frame`` in
#: UpSampleBilinear2d.cu, the bicubic kernel alike) runs one thread per output pixel, and each thread
#: loops over every (sample, channel) plane in turn; a channels-last input gets one thread per output
#: element instead, and nearest-neighbour upsampling spreads the planes over threads in either layout.
SERIAL_RESIZE_METHODS = frozenset({"linear", "cubic"})
#: Threads per block of those kernels (min(maxThreadsPerBlock, 1024)).
SERIAL_LOOP_BLOCK_THREADS = 1024


def _serial_loop(resize: Node) -> tuple[int, int]:
    """(iterations each thread runs one after another, thread blocks) of an NCHW bilinear or bicubic
    resize; (0, 0) where its kernel spreads the planes over threads."""
    attrs = resize.attrs
    if (attrs.get("method") not in SERIAL_RESIZE_METHODS or attrs.get("eager_channels_last")
            or attrs.get("layout", "NCHW") != "NCHW" or not resize.inputs or len(resize.outputs[0].shape) != 4):
        return 0, 0
    n, c = resize.inputs[0].shape[:2]
    h, w = resize.outputs[0].shape[2:]
    return n * c, -(-h * w // SERIAL_LOOP_BLOCK_THREADS)


def _resize_layout(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> eager_layout.Layout:
    """ATen's upsampling kernels write their output in the layout their input suggests."""
    import torch

    if (not eager_layout.suggests_channels_last(tuple(inputs[0].shape), tuple(inputs[0].stride()))
            or len(outs[0]) != 4):
        return eager_layout.CONTIGUOUS
    return eager_layout.Layout((), (tuple(torch.empty(outs[0], device="meta",
                                                      memory_format=torch.channels_last).stride()),))


def _im2col_kernels(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """ATen's im2col on CUDA (``im2col_out_cuda_template`` in Im2Col.cu) zeroes its output, then
    launches its kernel once per sample of the batch, one after another; col2im runs one batched kernel."""
    return 1 + (args[0].shape[0] if len(args[0].shape) == 4 else 1)


register_relax(("relax.concat", "relax.nn.pad", "relax.take", "relax.tile", "relax.repeat", "relax.flip",
                "relax.image.grid_sample", "relax.gather_elements", "relax.gather_nd", "relax.scatter_elements",
                "relax.scatter_nd", "relax.one_hot", "relax.layout_transform", "relax.stack", "relax.index_put",
                "relax.index_tensor", "relax.roll", "relax.tril", "relax.triu", "relax.meshgrid", "relax.zeros",
                "relax.ones", "relax.full", "relax.zeros_like", "relax.ones_like", "relax.full_like", "relax.arange",
                "relax.nn.pixel_shuffle", "relax.hamming_window", "relax.eye", "relax.eye_like", "relax.masked_fill",
                "relax.image.resize3d", "relax.slice_scatter"), MOVEMENT, _rules.zero)
register("image_resize2d", MOVEMENT, _rules.zero, relax=("relax.image.resize2d",), layout=_resize_layout,
         dispatch_on_layout=True, serial_loop=_serial_loop)
# a slice whose bounds are tensors: laid out as a slice, but a kernel runs it
register("dynamic_strided_slice", MOVEMENT, _rules.zero, relax=("relax.dynamic_strided_slice",),
         layout=eager_layout.sliced)

# ATen operators TVM's importer misses or rejects on some models (benchmarks/coverage.py lists them).
spell_aten(("select_scatter.default", "slice_scatter.default"), "slice_scatter")
spell_aten(("index.Tensor", "_unsafe_index.Tensor"), "index_tensor")
spell_aten(("_unsafe_index_put.default", "index_put.default"), "index_put")
spell_aten(("roll.default",), "roll", kept_whole=True)
# F.unfold and F.fold (VOLO's outlook attention, TNT's pixel embedding) are one ATen kernel each in
# eager, in their input's dtype; decomposed they become a padded copy, a gather and a copy (im2col), and
# a scatter into a float32 zero buffer and a crop (col2im): three extra full-size tensors and a float32
# one where eager makes one tensor of its input's precision. Kept whole, they read as the gather and the
# scatter-add they are (kinds PMGNS has seen in other families); col2im sums the patches that overlap.
spell_aten(("im2col.default",), "index_tensor", kernels=_im2col_kernels, kept_whole=True)
spell_aten(("col2im.default",), "index_put", flops=_rules.per_input, kept_whole=True)
spell_aten((COPY_OP,), "layout_transform", kept_whole=True)
