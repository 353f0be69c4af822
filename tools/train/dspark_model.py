"""dspark_model.py - the DSpark draft's forward pass in torch, for training (spec §10.1.3; the graph ringlm
runs is src/speculate/dspark.c, llama.cpp's generic dflash layout).

For one target window it drafts many blocks at once: every anchor position n gets its block
[x_n, MASK, ...] at positions n .. n+B-1, attending (non-causally) to itself and to the injected context
of positions 0 .. n-1, i.e. g_i = RMSNorm(fc . taps_i; enc.output_norm) turned into each layer's K and V.
The Markov bias of slot i is taken from the token before it (teacher forcing: the text's token, where
inference chains its own argmax); the confidence head reads [hid_i ; markov_w1[prev_i]].
The target's token embedding and LM head are used, frozen, as the draft file has neither.
"""
import math

import torch

from train_util import GgufModule


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_neox(x, pos, base):
    """x [..., T, heads, hd], pos [T]: GGML_ROPE_TYPE_NEOX (pairs (i, i + hd/2)), freq_scale 1."""
    hd = x.shape[-1]
    half = hd // 2
    inv = base ** (-torch.arange(0, half, dtype=torch.float32) * 2.0 / hd)
    ang = pos.float().unsqueeze(-1) * inv  # [T, half]
    cos, sin = torch.cos(ang).unsqueeze(-2), torch.sin(ang).unsqueeze(-2)  # [T, 1, half]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class DSpark(GgufModule):
    def __init__(self, gguf, tok_embd, lm_head):
        super().__init__()
        kv = gguf.kv
        a = "dflash."
        self.d = kv[a + "embedding_length"]
        self.L = kv[a + "block_count"]
        self.H = kv[a + "attention.head_count"]
        self.Hkv = kv[a + "attention.head_count_kv"]
        self.hd = kv[a + "attention.key_length"]
        self.eps = kv[a + "attention.layer_norm_rms_epsilon"]
        self.base = kv.get(a + "rope.freq_base", 10000.0)
        self.block = kv[a + "block_size"]
        self.taps = list(kv[a + "target_layers"])
        self.mask_id = kv["tokenizer.ggml.mask_token_id"]
        if not kv.get(a + "sample_from_anchor", True) or kv.get(a + "attention.causal", False):
            raise ValueError("the trainer drafts anchor-first, non-causal blocks only")
        self.load(gguf)
        self.tok_embd = tok_embd.detach()
        self.lm_head = lm_head.detach()

    def qk(self, x, w, heads, norm, pos):
        x = x @ w.t()
        x = x.reshape(*x.shape[:-1], heads, self.hd)
        return rope_neox(rms_norm(x, norm, self.eps), pos, self.base)

    def forward(self, feats, tokens, anchors):
        """feats [B, T, taps*d] (target taps of the window), tokens [B, T] (its text), anchors [A] positions
        with 1 <= n and n + block <= T. Returns logits [B, A, block, V], conf [B, A, block] and the
        hidden rows. Slot i of anchor n predicts tokens[n + 1 + i]."""
        Bn, T, _ = feats.shape
        A, S, H, Hkv, hd = len(anchors), self.block, self.H, self.Hkv, self.hd
        rep = H // Hkv
        g = rms_norm(feats @ self.w("fc.weight").t(), self.w("enc.output_norm.weight"), self.eps)  # [B, T, d]
        pos_ctx = torch.arange(T)
        pos_blk = anchors.unsqueeze(-1) + torch.arange(S)  # [A, S]
        blk_tok = torch.full((Bn, A, S), self.mask_id, dtype=torch.long)
        blk_tok[:, :, 0] = tokens[:, anchors]
        x = self.tok_embd[blk_tok]  # [B, A, S, d]
        ctx_ok = pos_ctx.view(1, T) < anchors.view(A, 1)  # [A, T]: context j visible to anchor n iff j < n
        bias_ctx = torch.zeros(A, T).masked_fill(~ctx_ok, float("-inf")).view(1, A, 1, 1, T)
        for il in range(self.L):
            P = f"blk.{il}."
            kc = self.qk(g, self.w(P + "attn_k.weight"), Hkv, self.w(P + "attn_k_norm.weight"), pos_ctx)  # [B,T,Hkv,hd]
            vc = (g @ self.w(P + "attn_v.weight").t()).reshape(Bn, T, Hkv, hd)
            xn = rms_norm(x, self.w(P + "attn_norm.weight"), self.eps)
            q = torch.stack([self.qk(xn[:, a], self.w(P + "attn_q.weight"), H, self.w(P + "attn_q_norm.weight"),
                                     pos_blk[a]) for a in range(A)], 1)  # [B, A, S, H, hd]
            kb = torch.stack([self.qk(xn[:, a], self.w(P + "attn_k.weight"), Hkv, self.w(P + "attn_k_norm.weight"),
                                      pos_blk[a]) for a in range(A)], 1)
            vb = (xn @ self.w(P + "attn_v.weight").t()).reshape(Bn, A, S, Hkv, hd)
            if rep > 1:
                kc, vc = kc.repeat_interleave(rep, 2), vc.repeat_interleave(rep, 2)
                kb, vb = kb.repeat_interleave(rep, 3), vb.repeat_interleave(rep, 3)
            scale = 1.0 / math.sqrt(hd)
            s_ctx = torch.einsum("basht,bkht->bahsk", q, kc) * scale + bias_ctx  # [B, A, H, S, T]
            s_blk = torch.einsum("basht,bakht->bahsk", q, kb) * scale           # [B, A, H, S, S]
            p = torch.softmax(torch.cat([s_ctx, s_blk], -1), -1)
            o = torch.einsum("bahsk,bkht->basht", p[..., :T], vc) + torch.einsum("bahsk,bakht->basht", p[..., T:], vb)
            x = x + o.reshape(Bn, A, S, H * hd) @ self.w(P + "attn_output.weight").t()
            xf = rms_norm(x, self.w(P + "ffn_norm.weight"), self.eps)
            f = torch.nn.functional.silu(xf @ self.w(P + "ffn_gate.weight").t()) * (xf @ self.w(P + "ffn_up.weight").t())
            x = x + f @ self.w(P + "ffn_down.weight").t()
        hid = rms_norm(x, self.w("output_norm.weight"), self.eps)
        logits = hid @ self.lm_head.t()
        # Markov bias from the previous token: the anchor for slot 0, the text's token after it for the rest.
        prev = tokens[:, (anchors.unsqueeze(-1) + torch.arange(S)).clamp_max(T - 1)]  # [B, A, S]
        e = self.w("markov_w1.weight")[prev]  # [B, A, S, R]
        logits = logits + e @ self.w("markov_w2.weight").t()
        conf = torch.sigmoid(torch.cat([hid, e], -1) @ self.w("conf_proj.weight") + self.w("conf_proj.bias"))
        return logits, conf
