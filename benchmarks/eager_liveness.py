"""How well the graph's liveness matches what PyTorch eager keeps alive, checked on this machine's CPU.

The analytical memory model frees each output after its last reader or, where the torch frontend
saw a module call holding it as an argument or a local variable holding it, once that call returns or
the variable lets it go (``eager_hold``). This runs
each model eagerly on the CPU at float32 with random weights, counts the bytes of every tensor an
ATen operator returns until Python drops its last reference (a ``TorchDispatchMode``; views share
their base's storage), and prints eager's peak over the model's peak of live activations (input
excluded, both at float32, no autocast, so only liveness differs), per model and summarised.

It needs no GPU: the CPU's own kernels' scratch memory is not counted, only the tensors Python
sees, which are what the liveness rules are about. Eager's math attention on the GPU is not the
CPU's fused kernel, so attention-heavy models read low here (NesT, SAM), and so does a model whose
operators copy a strided input inside the kernel (CaiT's softmax over a permuted tensor: the graph
counts that copy, as the GPU's caching allocator holds it, but Python never sees it).

    python benchmarks/eager_liveness.py                         # the models our H100 harness measured
    python benchmarks/eager_liveness.py --models resnet50 nasnetalarge --batch 4
    python benchmarks/eager_liveness.py --rebuild          # graphs exported now, not the graph store's
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys
import warnings
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_PARAMS = 400e6  # the build machine's 24 GB: the giants are left out


def eager_peak_bytes(model, x) -> int:
    """Peak bytes of the tensors the forward's ATen operators return, live until Python drops them."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.references: collections.Counter[int] = collections.Counter()
            self.sizes: dict[int, int] = {}
            self.live = self.peak = 0

        def _drop(self, pointer: int) -> None:
            self.references[pointer] -= 1
            if not self.references[pointer]:
                self.live -= self.sizes.pop(pointer)
                del self.references[pointer]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in tree_flatten(out)[0]:
                if not isinstance(tensor, torch.Tensor) or not (pointer := tensor.untyped_storage().data_ptr()):
                    continue
                if pointer not in self.sizes:
                    self.sizes[pointer] = tensor.untyped_storage().nbytes()
                    self.live += self.sizes[pointer]
                self.references[pointer] += 1
                weakref.finalize(tensor, self._drop, pointer)
            self.peak = max(self.peak, self.live)
            return out

    with torch.inference_mode():
        model(x)  # the first call may build caches
        mode = LiveBytes()
        with mode:
            model(x)
    return mode.peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", help="timm model names (default: those in data/measurements)")
    parser.add_argument("--batch", type=int, default=2, help="batch size (default: 2)")
    parser.add_argument("--rebuild", action="store_true",
                        help="export each graph with the current frontend instead of reading the graph store "
                             "(to check a liveness change before featurizing again)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import numpy as np
    import timm
    import torch
    from tqdm import tqdm

    from dippm_nas import build_graph
    from dippm_nas.cost.analytical import AnalyticalCostModel
    from dippm_nas.cost.table import node_table
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.dataset import load_graphs

    torch.set_num_threads(1)
    if args.models:
        models = [(m, None) for m in args.models]
    else:
        rows = [r for path in sorted((ROOT / "data" / "measurements").glob("*.csv"))
                for r in csv.DictReader(path.open(newline="")) if r["status"] == "ok" and r["source"] == "timm"]
        models = sorted({(r["model"], int(r["input_shape"].split("x")[-1])) for r in rows})
    analytical = AnalyticalCostModel()
    ratios: list[tuple[float, str]] = []
    skipped: list[str] = []
    for name, size in tqdm(models, desc="eager forwards", unit="model", file=sys.stderr):
        with torch.device("meta"):
            params = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
        if params > MAX_PARAMS:
            skipped.append(f"{name} ({params / 1e6:.0f} M parameters)")
            continue
        model = timm.create_model(name, pretrained=False).eval()
        size = size or model.default_cfg["input_size"][-1]
        stored = None if args.rebuild else load_graphs({f"timm:{name}@{size}"}).get(f"timm:{name}@{size}")
        graph = stored or build_graph(name, (3, size, size))
        table = node_table(scale_batch(graph, args.batch))
        predicted = analytical.peak_activations(table, "fp32") - table.input_bytes
        measured = eager_peak_bytes(model, torch.randn(args.batch, 3, size, size))
        ratios.append((measured / predicted, name))
    values = np.array([r for r, _ in ratios])
    print(f"{len(values)} models at batch {args.batch}, float32, CPU"
          + (f"; left out: {', '.join(skipped)}" if skipped else ""))
    print(f"eager's peak live bytes over the graph's: median {np.median(values):.3f}, "
          f"10th-90th percentile {np.percentile(values, 10):.2f}-{np.percentile(values, 90):.2f}, "
          f"mean |log| {np.abs(np.log(values)).mean():.3f}, within 10 %: {np.mean(np.abs(values - 1) <= 0.1):.0%}")
    print("per model, from the most over-counted to the most under-counted:")
    for ratio, name in sorted(ratios):
        print(f"  {name:44s} {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
