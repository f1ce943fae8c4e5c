"""The attention backward benchmark's tables (flashsci.bench.backward), on recorded-shape rows: no GPU needed."""
import pytest

from flashsci.bench.backward import _markdown

META = {"gpu": "GPU", "torch": "2.x", "cudnn": 1, "dtype": "bfloat16", "date": "today", "fasta": "f.fasta.gz",
        "portable": False}


def varlen_row(batch, tokens, fs_us, tflops, sdpa_us, varlen_us=None, varlen_speedup=None):
    return {"set": "varlen", "batch": batch, "B": 2, "S": 100, "tokens": tokens, "D": 64, "H": 40, "causal": False,
            "flashsci us": fs_us, "flashsci TF/s": tflops, "sdpa+mask us": sdpa_us,
            "speedup vs sdpa+mask": sdpa_us / fs_us, "varlen_attn us": varlen_us,
            "speedup vs varlen_attn": varlen_speedup}


def all_row(rows):
    lines = [line for line in _markdown(rows, META).splitlines() if line.startswith("| all |")]
    assert len(lines) <= 1
    return [c.strip() for c in lines[0].strip("|").split("|")] if lines else None


def test_varlen_batches_together():
    """Times summed: speedup = total SDPA time / total flashsci time, TF/s weighted by time; varlen_attn's pairs use
    flashsci's time in those pairs (their time over the speedup)."""
    rows = [varlen_row(0, 100, 100.0, 200.0, 500.0, 120.0, 1.2), varlen_row(1, 300, 300.0, 100.0, 600.0, 330.0, 1.1)]
    cells = all_row(rows)
    assert cells == ["all", "", "400", "400.0", "125", "1100.0", "2.75×", "450.0", "1.12×"]
    assert float(cells[8].rstrip("×")) == pytest.approx(450 / (100 + 300), abs=0.005)


def test_varlen_without_varlen_attn_and_single_batch():
    rows = [varlen_row(0, 100, 100.0, 200.0, 500.0), varlen_row(1, 300, 300.0, 100.0, 600.0)]
    assert all_row(rows)[-2:] == ["", ""]       # torch without varlen_attn: its cells left blank
    assert all_row(rows[:1]) is None            # one batch: no sum row
