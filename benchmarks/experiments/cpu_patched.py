"""(CPU) A patched HF ESM2 model against stock transformers (sdpa) on the CPU: inference and one masked-LM training
step (forward + backward), on 8 proteins of 300 residues and on a length mix of 80-1,000 (stock pads it to 1,000),
ESM2-35M's shape (hidden 480, 20 heads of 24, FFN 1,920) with 6 layers and random weights, medians of 3 after a
warm-up; prints a markdown table. python benchmarks/experiments/cpu_patched.py"""
import platform
import time

import torch
from transformers import EsmConfig, EsmForMaskedLM

from flashsci.integrations import patch, unpatch

BATCHES = {"8 x 300": [300] * 8, "mix 80-1000": [1000, 80, 150, 300, 200, 120, 90, 400]}


def median_s(fn, n=3):
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2]


def batch(lengths):
    ids = torch.randint(4, 24, (len(lengths), max(lengths)))
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return ids, mask, ids.masked_fill(mask == 0, -100)


def main():
    torch.manual_seed(0)
    cfg = EsmConfig(vocab_size=33, hidden_size=480, num_hidden_layers=6, num_attention_heads=20, intermediate_size=1920,
                    position_embedding_type="rotary", pad_token_id=1, mask_token_id=32, token_dropout=False,
                    attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, attn_implementation="sdpa")
    model = EsmForMaskedLM(cfg)
    print(f"CPU {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}\n")
    print("| batch | pass | stock ms | patched ms | speedup |\n|---|---|---|---|---|")
    for name, lengths in BATCHES.items():
        ids, mask, labels = batch(lengths)

        def infer():
            with torch.inference_mode():
                model.eval()(input_ids=ids, attention_mask=mask)

        def train():
            model.train().zero_grad(set_to_none=True)
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        for label, fn in (("inference", infer), ("training step", train)):
            stock = median_s(fn)
            patch(model)
            patched = median_s(fn)
            unpatch(model)
            print(f"| {name} | {label} | {stock * 1e3:.0f} | {patched * 1e3:.0f} | {stock / patched:.2f}x |")


if __name__ == "__main__":
    main()
