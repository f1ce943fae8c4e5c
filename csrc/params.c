/* The one builder of the kernels' attention problem (fs_attn_params) from checked tensors and parsed options, used by
 * attention(), attention_varlen() and the launch-plan hook. */
#include "flashsci.h"

#include <math.h>

fs_operand fs_operand_padded(const fs_tensor *t, int bshd)
{
    const int ih = bshd ? 2 : 1, is = bshd ? 1 : 2;
    fs_operand o = {t->data, t->strides[0], t->strides[ih], t->strides[is]};
    return o;
}

fs_operand fs_operand_packed(const fs_tensor *t)
{
    fs_operand o = {t->data, 0, t->strides[1], t->strides[0]};
    return o;
}

void fs_attn_params_build(fs_attn_params *p, const fs_attn_options *opt, int B, int H, int Hkv, int Sq, int Sk, int D,
                          fs_dtype dtype, fs_operand q, fs_operand k, fs_operand v, fs_operand o)
{
    memset(p, 0, sizeof *p);
    p->q = q.data; p->q_sb = q.sb; p->q_sh = q.sh; p->q_ss = q.ss;
    p->k = k.data; p->k_sb = k.sb; p->k_sh = k.sh; p->k_ss = k.ss;
    p->v = v.data; p->v_sb = v.sb; p->v_sh = v.sh; p->v_ss = v.ss;
    p->o = o.data; p->o_sb = o.sb; p->o_sh = o.sh; p->o_ss = o.ss;
    p->B = B;
    p->H = H;
    p->Sq = Sq;
    p->Sk = Sk;
    p->D = D;
    p->kv_group = fs_kv_group(H, Hkv, k.sh, v.sh);
    p->scale = opt->has_scale ? opt->scale : 1.0 / sqrt((double)D);
    p->causal = opt->causal;
    p->dtype = dtype;
    p->rotary = opt->rotary;
    p->rotary_base = opt->rotary_base;
}
