"""How a forward pass is issued: the execution modes, one table the command line, the API and the calibration
read (without numpy, so the command line answers a bad mode before anything heavy is imported)."""

from __future__ import annotations

from dippm_nas.errors import DippmError, suggest

#: ``eager``: PyTorch issues every operator from the host (the default). ``cuda-graphs``: the forward
#: pass is captured once and replayed as one graph, so no operator waits on the host. ``compile``: the model as
#: ``torch.compile(model)`` runs it (TorchDynamo and Inductor, default mode): fused kernels, issued one by one.
#: ``compile-cudagraphs``: ``torch.compile(model, mode="reduce-overhead")``, the same fused kernels replayed as one
#: CUDA graph.
EXECUTION_MODES = ("eager", "cuda-graphs", "compile", "compile-cudagraphs")
DEFAULT_MODE = EXECUTION_MODES[0]
#: The modes whose kernels are Inductor's, grouped by the fusion stage, not eager's operators.
COMPILED_MODES = frozenset({"compile", "compile-cudagraphs"})
#: The modes replayed as a CUDA graph: the GPU never waits on the host between kernels.
REPLAYED_MODES = frozenset({"cuda-graphs", "compile-cudagraphs"})


def check_mode(mode: str) -> str:
    """``mode`` itself if it is an execution mode, else an error that lists them.

    >>> check_mode("cuda-graphs")
    'cuda-graphs'
    """
    key = mode.strip().lower() if isinstance(mode, str) else mode
    if key not in EXECUTION_MODES:
        raise DippmError(f"unknown execution mode {mode!r}; known: {', '.join(EXECUTION_MODES)}."
                         + suggest(key, EXECUTION_MODES))
    return key


#: What a prediction assumes of each mode but eager, as its note says it.
MODE_NOTES = {
    "cuda-graphs": "cuda-graphs: priced as one replay of the captured forward pass, its kernels launched back to back "
                   "with no host time between them; the capture, its warm-up and the copy of new inputs into its "
                   "static tensors are not priced. The memory is eager's: the graph's private memory pool, which "
                   "holds the activations again where the warm-up's cached blocks are kept (no "
                   "torch.cuda.empty_cache() after it), is not priced",
    "compile": "compile: priced as torch.compile(model) with its default backend and mode runs it once compiled "
               "(TorchDynamo and Inductor: matrix products, convolutions and attention as library calls, the other "
               "operators fused into generated kernels, no CUDA graphs); the compile time is not part of the "
               "latency, and the memory is eager's (Inductor's own buffer planning is not priced)",
    "compile-cudagraphs": "compile-cudagraphs: priced as torch.compile(model, mode=\"reduce-overhead\") runs it "
                          "once compiled and captured: the kernels of mode compile, replayed as one CUDA graph with "
                          "no host time between them; the compile time, the capture and the copy of new inputs "
                          "into its static tensors are not priced, and the memory is eager's",
}
#: What a latency error measured on eager timings says under another mode.
EAGER_RECORDS = "these records are eager timings: no forward pass replayed as a CUDA graph or compiled was held out"
