"""CUDA-graph capture for the GPU tests."""

import torch


def capture(step, keep_graph: bool = False):
    """(graph, what step returned while captured), after a warm-up run on a side stream (loads the
    library and lets the allocator settle outside capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs
