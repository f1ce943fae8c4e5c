"""flashsci's benchmarks against torch (GPU) and NumPy (CPU): python -m flashsci.bench --help.

Modules: timing (the shared timers), results (JSON, markdown and PNG writers), proteins (the UniProt length mix);
one module per set: attention (seed, protein, sweep), features, gqa, linear, e2e (HF protein models), cpu; models/
holds the model definitions the end-to-end set runs.
"""
