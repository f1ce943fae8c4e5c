"""Where the time goes: protein language models and the transformer-LM grid under torch.profiler, stock beside
flashsci, in the tables of the profiling studies (kernel time per category, top kernels with call counts, GEMM
fraction, CUDA time per batch, peak memory, dtype-conversion copies).

    python -m flashsci.profile                       # ESM2-3B, ESM-C-600M, ProtT5-XL on real UniProt batches
    python -m flashsci.profile ProtT5-XL --batches 2 --out results/
    python -m flashsci.bench --lm-grid               # the LM grid (naive / SDPA / flashsci attention)

categories: the kernel-name rules; trace: capture and read a profile; report: the tables and the plot.
"""
