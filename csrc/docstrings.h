/* Docstrings of the public functions, each opening with the signature line CPython turns into __text_signature__
 * (so help() and inspect.signature show the arguments). Included by module.c only. */
#ifndef FLASHSCI_DOCSTRINGS_H
#define FLASHSCI_DOCSTRINGS_H

#include <Python.h>

PyDoc_STRVAR(attention_doc,
"attention($module, q, k, v, /, *, causal=False, scale=None, layout='bhsd', out=None, return_lse=False,\n"
"          stream=None, key_padding_mask=None, seqlens=None, bias=None, t5_bias=None, rotary=None)\n"
"--\n"
"\n"
"softmax(scale * q k^T [+ bias] [+ causal mask]) v in one pass over k and v (no S x S buffer).\n"
"\n"
"q, k, v: 4-D arrays, (B, H, S, D) for layout='bhsd' (torch SDPA) or (B, S, H, D) for 'bshd'\n"
"    (FlashAttention); torch, NumPy, CuPy, JAX or any DLPack / __cuda_array_interface__ producer, read\n"
"    without a copy. The last dim must be contiguous. k and v may have fewer heads than q (grouped-query\n"
"    attention: query head h reads K/V head h // (H / Hkv)). Sq may differ from Sk.\n"
"causal: top-left aligned as torch's is_causal (query i sees keys j <= i).\n"
"scale: default 1 / sqrt(D); any finite float.\n"
"out: write the result there (q's shape, dtype and device); it is returned.\n"
"return_lse: also return the logsumexp of the scaled scores, (B, H, Sq), float32 (float64 for float64).\n"
"stream: CUDA stream (int handle, or an object with __cuda_stream__ / cuda_stream); default: torch's\n"
"    current stream for torch tensors, the legacy default stream otherwise.\n"
"key_padding_mask: bool (B, Sk), True = keep; a row with no kept key gives zeros (lse -inf).\n"
"seqlens: int32 (B,), self-attention on a padded batch: rows and keys past each length are skipped.\n"
"bias: float array broadcastable to (B, H, Sq, Sk), added to the scaled scores.\n"
"t5_bias: (table, num_buckets, max_distance, bidirectional), table (H, num_buckets): T5's relative-position\n"
"    bias computed in the kernel (ProtT5: scale=1.0, t5_bias=(table, 32, 128, True)).\n"
"rotary: True (base 10000) or a base: rotary embeddings on q (after scaling) and k, ESM's convention.\n"
"\n"
"Returns the output in the caller's framework (torch.Tensor, numpy.ndarray, else flashsci.Array), or\n"
"(out, lse) with return_lse. CPU: float16/bfloat16/float32/float64; CUDA: float16/bfloat16.\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> q = np.random.rand(2, 4, 100, 64).astype('float32')\n"
"    >>> flashsci.attention(q, q, q, causal=True).shape\n"
"    (2, 4, 100, 64)");

PyDoc_STRVAR(attention_varlen_doc,
"attention_varlen($module, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,\n"
"                 scale=None, out=None, return_lse=False, stream=None, t5_bias=None, rotary=None)\n"
"--\n"
"\n"
"Attention over packed variable-length sequences (FlashAttention's convention): no padding anywhere.\n"
"\n"
"q: (total_q, H, D); k, v: (total_k, Hkv, D), Hkv dividing H. cu_seqlens_q, cu_seqlens_k: int32 (B + 1,)\n"
"offsets starting at 0: sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b + 1]. max_seqlen_q / _k: the\n"
"longest lengths. Causal is top-left within each sequence, rotary and T5 positions restart per sequence,\n"
"and lse comes back as (H, total_q). Other arguments as for attention().\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> q = np.random.rand(7, 2, 16).astype('float32')        # sequences of 3 and 4 tokens\n"
"    >>> cu = np.array([0, 3, 7], dtype='int32')\n"
"    >>> flashsci.attention_varlen(q, q, q, cu, cu, 4, 4).shape\n"
"    (7, 2, 16)");

PyDoc_STRVAR(attention_backward_doc,
"attention_backward($module, dout, q, k, v, out, lse, /, *, causal=False, scale=None, layout='bhsd',\n"
"                   key_padding_mask=None, seqlens=None, bias=None, t5_bias=None, rotary=None, dq=None, dk=None,\n"
"                   dv=None, bias_grad=False, t5_grad=False, deterministic=False, stream=None)\n"
"--\n"
"\n"
"The gradients of attention(q, k, v, ...) with respect to q, k and v, given dout (the gradient of the output) and\n"
"the forward's out and lse (attention(..., return_lse=True)). The options must be the forward's.\n"
"\n"
"Returns (dq, dk, dv) with q's, k's and v's shapes (grouped K/V heads: summed over the query heads sharing them;\n"
"rotary: with respect to the unrotated q and k), then dbias in the bias's own shape with bias_grad=True (summed\n"
"over its broadcast dims), then the T5 table's gradient (H, num_buckets) float32 with t5_grad=True. dq, dk, dv:\n"
"write the gradients there. deterministic=True: bit-identical results run to run (the CPU always is; CUDA then\n"
"accumulates dq without float atomics). Rows with no kept key get zero gradients. No S x S buffer anywhere.\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> q, k, v = (np.random.rand(1, 2, 8, 16) for _ in range(3))\n"
"    >>> out, lse = flashsci.attention(q, k, v, return_lse=True)\n"
"    >>> dq, dk, dv = flashsci.attention_backward(np.ones_like(out), q, k, v, out, lse)\n"
"    >>> dq.shape\n"
"    (1, 2, 8, 16)");

PyDoc_STRVAR(attention_varlen_backward_doc,
"attention_varlen_backward($module, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,\n"
"                          max_seqlen_k, /, *, causal=False, scale=None, t5_bias=None, rotary=None, dq=None, dk=None,\n"
"                          dv=None, t5_grad=False, deterministic=False, stream=None)\n"
"--\n"
"\n"
"The gradients of attention_varlen(...) over packed sequences: dout, out (total_q, H, D), lse (H, total_q) as the\n"
"forward returned them. Returns (dq, dk, dv) packed like q, k, v, then the T5 table's gradient with t5_grad=True.\n"
"Other arguments as for attention_backward().\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> q = np.random.rand(7, 2, 16)\n"
"    >>> cu = np.array([0, 3, 7], dtype='int32')\n"
"    >>> out, lse = flashsci.attention_varlen(q, q, q, cu, cu, 4, 4, return_lse=True)\n"
"    >>> [g.shape for g in flashsci.attention_varlen_backward(np.ones_like(out), q, q, q, out, lse, cu, cu, 4, 4)]\n"
"    [(7, 2, 16), (7, 2, 16), (7, 2, 16)]");

PyDoc_STRVAR(linear_doc,
"linear($module, x, weight, bias=None, *, activation=None, out=None, out_dtype=None, preactivation=None,\n"
"       stream=None)\n"
"--\n"
"\n"
"act(x @ weight.T + bias) in one kernel.\n"
"\n"
"x: [..., K] (leading dims that collapse to one row stride); weight: [N, K] as nn.Linear stores it;\n"
"bias: [N] in x's dtype or float32. activation: None, 'relu', 'gelu' (erf), 'gelu_tanh' or 'silu'.\n"
"out_dtype: float16, bfloat16, float32 (CPU: also float64); a name, NumPy or torch dtype. On CUDA, N and K\n"
"must be multiples of 8. fp16/bf16 in, fp32 accumulation (CPU: float64).\n"
"preactivation: an array [..., N] of x's dtype that receives x @ weight.T + bias, the activation's input\n"
"that linear_backward needs; the activation then runs as a pass of its own.\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> x, w = np.random.rand(4, 32).astype('float32'), np.random.rand(16, 32).astype('float32')\n"
"    >>> flashsci.linear(x, w, activation='gelu').shape\n"
"    (4, 16)");

PyDoc_STRVAR(swiglu_doc,
"swiglu($module, x, w_gate, w_up=None, *, out=None, out_dtype=None, preactivation=None, stream=None)\n"
"--\n"
"\n"
"silu(x @ w_gate.T) * (x @ w_up.T) in one kernel (ESM-C's feed-forward). With w_up=None, w_gate is one\n"
"packed [2N, K] weight, gate rows first. Shapes, dtypes and devices as for linear(). preactivation: an\n"
"array [..., 2N] that receives the gate then the up projection, for swiglu_backward.\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> x, w = np.random.rand(4, 32).astype('float32'), np.random.rand(48, 32).astype('float32')\n"
"    >>> flashsci.swiglu(x, w).shape\n"
"    (4, 24)");

PyDoc_STRVAR(linear_backward_doc,
"linear_backward($module, dy, x, weight, *, preactivation=None, activation=None, bias_grad=False, dx=None,\n"
"                dweight=None, dbias=None, stream=None)\n"
"--\n"
"\n"
"Gradients of y = linear(x, weight, bias, activation=...): returns (dx, dweight, dbias), dbias None unless\n"
"bias_grad. dy: [..., N] like y; preactivation: the [..., N] array the forward filled (required with an\n"
"activation). dh = dy * act'(h) in one elementwise pass (with dbias, its column sums, accumulated in fp32),\n"
"then dx = dh @ weight and dweight = dh.T @ x as two products that read their operands transposed (no\n"
"copies). dx, dweight in x's dtype; dbias in x's dtype, or float32 when a float32 dbias= is given.\n"
"dx=, dweight=, dbias=: arrays to write into. Limits as for linear().\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> x, w = np.random.rand(4, 32), np.random.rand(16, 32)\n"
"    >>> h = np.empty((4, 16)); y = flashsci.linear(x, w, activation='gelu', preactivation=h)\n"
"    >>> dx, dw, db = flashsci.linear_backward(np.ones_like(y), x, w, preactivation=h, activation='gelu',\n"
"    ...                                       bias_grad=True)\n"
"    >>> dx.shape, dw.shape, db.shape\n"
"    ((4, 32), (16, 32), (16,))");

PyDoc_STRVAR(swiglu_backward_doc,
"swiglu_backward($module, dy, x, w_gate, w_up=None, *, preactivation, dx=None, dw_gate=None, dw_up=None,\n"
"                stream=None)\n"
"--\n"
"\n"
"Gradients of y = swiglu(x, w_gate, w_up): returns (dx, dw_gate, dw_up), or (dx, dw) for a packed [2N, K]\n"
"w_gate (w_up=None). preactivation: the [..., 2N] array the forward filled (gate, then up). dg = dy * u *\n"
"silu'(g) and du = dy * silu(g) in one pass, dx = dg @ w_gate + du @ w_up as one product, the weight\n"
"gradients as products that read dg, du and x transposed.\n"
"\n"
"Example:\n"
"    >>> import numpy as np, flashsci\n"
"    >>> x, w = np.random.rand(4, 32), np.random.rand(48, 32)\n"
"    >>> h = np.empty((4, 48)); y = flashsci.swiglu(x, w, preactivation=h)\n"
"    >>> [g.shape for g in flashsci.swiglu_backward(np.ones_like(y), x, w, preactivation=h)]\n"
"    [(4, 32), (48, 32)]");

PyDoc_STRVAR(cuda_device_count_doc,
"cuda_device_count($module, /)\n"
"--\n"
"\n"
"Number of visible CUDA devices: 0 without a driver or GPU, and in a build without CUDA.\n"
"\n"
"Example:\n"
"    >>> import flashsci\n"
"    >>> flashsci.cuda_device_count() >= 0\n"
"    True");

PyDoc_STRVAR(device_info_doc,
"device_info($module, device=0, /)\n"
"--\n"
"\n"
"Name, compute capability, multiprocessor count and shared memory per block of a CUDA device, as a dict.\n"
"Raises RuntimeError where no CUDA driver or GPU is found.\n"
"\n"
"Example:\n"
"    >>> import flashsci\n"
"    >>> flashsci.device_info(0)['capability']      # doctest: +SKIP\n"
"    (9, 0)");

PyDoc_STRVAR(build_info_doc,
"build_info($module, /)\n"
"--\n"
"\n"
"How this extension was built: CUDA support, its architecture list and the CPU threads the CPU kernels use\n"
"(FLASHSCI_NUM_THREADS, else the online processors).\n"
"\n"
"Example:\n"
"    >>> import flashsci\n"
"    >>> sorted(flashsci.build_info())\n"
"    ['cuda', 'cuda_architectures', 'num_threads']");

#endif
