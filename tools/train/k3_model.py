"""k3_model.py - the Kimi K3 forward pass in torch, for training (spec: docs/k3-spec.md §5).

The model is built from a GGUF that `ringlm synth --type f32` wrote: its metadata gives the shapes, its
tensors the initial values, and `tensors()` hands back every trained value under the file's own names, in
the file's layout, so gguf_io writes them over the seeded ones. Every step follows the spec's order of
operations (ResMix, KDA with its short conv and gated delta rule, the absorbed MLA, SiTU, the latent MoE
with a sigmoid router and a selection-only bias), in f32; rounding differs from ggml's, the function does
not (tests/t_trained.sh compares this forward with `ringlm logits`).

Training-only choices, none of which changes the function the file describes:
- routed experts run sparse (each expert over the tokens that chose it), gradients reach the router through
  the top-k weights as in DeepSeek-V3 / K2;
- exp_probs_b, the selection bias, is not trained by gradient: it is nudged after each step toward equal
  expert load (DeepSeek-V3's auxiliary-loss-free balancing), the role it has in K3.
"""
import math

import torch
import torch.nn.functional as F

from train_util import GgufModule


def rms_norm(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def l2_norm(x, eps):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def situ(g, u, beta, beta_lin):
    a = torch.tanh(g * (1.0 / beta)) * beta * torch.sigmoid(g)
    if beta_lin > 0:
        u = torch.tanh(u * (1.0 / beta_lin)) * beta_lin
    return a * u


def delta_rule_loop(q, k, v, g, beta):
    """The KDA recurrence token by token, as the spec writes it (§5.3 step 5): q, k, v, g [B, T, H, Dk],
    beta [B, T, H] -> o [B, T, H, Dk]. The state M[i][j] (i = key dim) starts at zero."""
    Bn, T, H, Dk = q.shape
    M = q.new_zeros(Bn, H, Dk, Dk)
    decay = torch.exp(g)
    outs = []
    for t in range(T):
        M = M * decay[:, t].unsqueeze(-1)
        kt = k[:, t]
        u = torch.einsum("bhij,bhi->bhj", M, kt)
        delta = beta[:, t].unsqueeze(-1) * (v[:, t] - u)
        M = M + kt.unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append(torch.einsum("bhij,bhi->bhj", M, q[:, t]))
    return torch.stack(outs, 1) * (1.0 / math.sqrt(Dk))


def delta_rule_chunked(q, k, v, g, beta, C=16):
    """The same recurrence in chunks of C tokens (the WY form of gated delta rules, with KDA's decay per key
    dimension): inside a chunk, with G_t the cumulative log decay since the chunk start,
        delta = (I + A)^-1 beta (v - (k e^G) S),  A[t][s] = beta_t sum_i k_t[i] k_s[i] e^(G_t[i] - G_s[i]), s < t
        o_t   = S^T (q_t e^G_t) + sum_{s <= t} (sum_i q_t[i] k_s[i] e^(G_t[i] - G_s[i])) delta_s
        S'    = e^G_C S + sum_s (k_s e^(G_C - G_s)) delta_s^T
    One Python step per chunk instead of per token: what makes training affordable on a CPU."""
    Bn, T, H, Dk = q.shape
    pad = (-T) % C
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, 0, 0, pad))
    N = (T + pad) // C
    # [B, H, N, C, Dk]
    q, k, v, g = (x.reshape(Bn, N, C, H, Dk).permute(0, 3, 1, 2, 4) for x in (q, k, v, g))
    beta = beta.reshape(Bn, N, C, H).permute(0, 3, 1, 2)
    G = g.cumsum(3)
    # e^(G_t - G_s) = e^(G_t - R) e^(R - G_s) with R the chunk's middle: each factor stays within
    # e^(+-C/2 * |lb|) (e^40 for C = 16, lb = -5), far from f32's range, and A, B become matmuls.
    R = G[:, :, :, C // 2 - 1:C // 2, :]
    up, down = torch.exp(G - R), torch.exp(R - G)
    strict = torch.ones(C, C, dtype=torch.bool).tril(-1)
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    A = ((k * up) @ (k * down).transpose(-1, -2)).masked_fill(~strict, 0.0) * beta.unsqueeze(-1)
    Bm = ((q * up) @ (k * down).transpose(-1, -2)).masked_fill(~lower, 0.0)
    I = torch.eye(C).expand_as(A)
    Kg = k * torch.exp(G)
    U = torch.linalg.solve_triangular(I + A, beta.unsqueeze(-1) * v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(I + A, beta.unsqueeze(-1) * Kg, upper=False, unitriangular=True)
    Qg = q * torch.exp(G)
    Kend = k * torch.exp(G[:, :, :, -1:, :] - G)
    decay_end = torch.exp(G[:, :, :, -1, :])  # [B, H, N, Dk]
    S = q.new_zeros(Bn, H, Dk, Dk)
    outs = []
    for n in range(N):
        delta = U[:, :, n] - W[:, :, n] @ S  # [B, H, C, Dk]
        outs.append(Qg[:, :, n] @ S + Bm[:, :, n] @ delta)
        S = decay_end[:, :, n].unsqueeze(-1) * S + Kend[:, :, n].transpose(-1, -2) @ delta
    o = torch.stack(outs, 2).permute(0, 2, 3, 1, 4).reshape(Bn, N * C, H, Dk)[:, :T]
    return o * (1.0 / math.sqrt(Dk))


class K3(GgufModule):
    def __init__(self, gguf, chunked=True):
        super().__init__()
        self.chunked = chunked
        kv = gguf.kv
        a = "kimi-k3."
        self.L = kv[a + "block_count"]
        self.d = kv[a + "embedding_length"]
        self.H = kv[a + "attention.head_count"]
        self.eps = kv[a + "attention.layer_norm_rms_epsilon"]
        self.is_mla = [x == 1 for x in kv[a + "attention.head_count_kv"]]
        self.Dk = kv[a + "kda.head_dim"]
        self.Kc = kv[a + "ssm.conv_kernel"]
        self.lb = kv.get(a + "kda.gate_lower_bound")
        self.rkv = kv[a + "attention.kv_lora_rank"]
        self.dr = kv[a + "rope.dimension_count"]
        self.dq = kv[a + "attention.key_length_mla"]
        self.dv = kv[a + "attention.value_length_mla"]
        self.dn = self.dq - self.dr
        self.n_dense = kv.get(a + "leading_dense_block_count", 0)
        self.E = kv.get(a + "expert_count", 0)
        self.k = kv.get(a + "expert_used_count", 0)
        self.wnorm = kv.get(a + "expert_weights_norm", False)
        self.wscale = kv.get(a + "expert_weights_scale", 0.0)
        self.B = kv[a + "attn_res.block_size"]
        self.beta = kv[a + "activation.situ_beta"]
        self.beta_lin = kv[a + "activation.situ_linear_beta"]
        if kv[a + "expert_gating_func"] != 2:
            raise ValueError("the trainer implements the sigmoid router (expert_gating_func 2) only")
        # exp_probs_b, the selection bias, is balanced after each step (balance), not trained by gradient
        self.load(gguf, is_buffer=lambda name: name.endswith("exp_probs_b.bias"))

    # ---- blocks ------------------------------------------------------------------------------------

    def resmix(self, h, stack, w):
        if not stack:
            return h
        cands = stack + [h]
        scores = torch.stack([(rms_norm(c, None, self.eps) * w).sum(-1) for c in cands], -1)
        p = torch.softmax(scores, -1)
        return sum(p[..., j:j + 1] * c for j, c in enumerate(cands))

    def conv(self, x, w):  # x [B, T, C], w [C, 1, Kc]: causal depthwise, taps in time order
        xt = F.pad(x.transpose(1, 2), (self.Kc - 1, 0))
        return F.conv1d(xt, w, groups=x.shape[-1]).transpose(1, 2)

    def kda(self, il, xn):
        P = f"blk.{il}."
        Bn, T, _ = xn.shape
        H, Dk = self.H, self.Dk
        q = F.silu(self.conv(xn @ self.w(P + "attn_q.weight").t(), self.w(P + "ssm_conv1d_q.weight")))
        k = F.silu(self.conv(xn @ self.w(P + "attn_k.weight").t(), self.w(P + "ssm_conv1d_k.weight")))
        v = F.silu(self.conv(xn @ self.w(P + "attn_v.weight").t(), self.w(P + "ssm_conv1d_v.weight")))
        q, k, v = (t.reshape(Bn, T, H, Dk) for t in (q, k, v))
        f = (xn @ self.w(P + "ssm_f_a.weight").t()) @ self.w(P + "ssm_f_b.weight").t() + self.w(P + "ssm_dt.bias")
        f = f.reshape(Bn, T, H, Dk)
        A = self.w(P + "ssm_a").reshape(1, 1, H, 1)
        if self.lb is not None and self.lb > -math.inf:
            g = self.lb * torch.sigmoid(-(f * A))
        else:
            g = F.softplus(f) * A
        beta = torch.sigmoid(xn @ self.w(P + "ssm_beta.weight").t())  # [B, T, H]
        q, k = l2_norm(q, self.eps), l2_norm(k, self.eps)
        o = delta_rule_chunked(q, k, v, g, beta) if self.chunked else delta_rule_loop(q, k, v, g, beta)
        o = rms_norm(o, self.w(P + "ssm_norm.weight"), self.eps)
        gate = torch.sigmoid(xn @ self.w(P + "ssm_g.weight").t()).reshape(Bn, T, H, Dk)
        y = (o * gate).reshape(Bn, T, H * Dk)
        return y @ self.w(P + "attn_output.weight").t()

    def mla(self, il, xn):
        P = f"blk.{il}."
        Bn, T, _ = xn.shape
        H = self.H
        if self.has(P + "attn_q_a.weight"):
            qa = rms_norm(xn @ self.w(P + "attn_q_a.weight").t(), self.w(P + "attn_q_a_norm.weight"), self.eps)
            qf = qa @ self.w(P + "attn_q_b.weight").t()
        else:
            qf = xn @ self.w(P + "attn_q.weight").t()
        qf = qf.reshape(Bn, T, H, self.dq)
        q_nope, q_pe = qf[..., :self.dn], qf[..., self.dn:]
        ckv = xn @ self.w(P + "attn_kv_a_mqa.weight").t()
        c = rms_norm(ckv[..., :self.rkv], self.w(P + "attn_kv_a_norm.weight"), self.eps)  # [B, T, rkv]
        k_pe = ckv[..., self.rkv:]
        kb = self.w(P + "attn_k_b.weight")  # [H, rkv, dn]
        vb = self.w(P + "attn_v_b.weight")  # [H, dv, rkv]
        qa = torch.einsum("bthi,hri->bthr", q_nope, kb)
        s = torch.einsum("bthr,bsr->bhts", qa, c) + torch.einsum("bthe,bse->bhts", q_pe, k_pe)
        s = s * (1.0 / math.sqrt(self.dq))
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        wts = torch.softmax(s, -1)
        ol = torch.einsum("bhts,bsr->bthr", wts, c)
        o = torch.einsum("bthr,hjr->bthj", ol, vb).reshape(Bn, T, H * self.dv)
        if self.has(P + "attn_gate.weight"):
            o = o * torch.sigmoid(xn @ self.w(P + "attn_gate.weight").t())
        return o @ self.w(P + "attn_output.weight").t()

    def ffn_dense(self, P, x, pre):
        g = x @ self.w(P + f"ffn_gate{pre}.weight").t()
        u = x @ self.w(P + f"ffn_up{pre}.weight").t()
        return situ(g, u, self.beta, self.beta_lin) @ self.w(P + f"ffn_down{pre}.weight").t()

    def moe(self, il, yn, loads):
        P = f"blk.{il}."
        shape = yn.shape
        x = yn.reshape(-1, shape[-1])
        z = x @ self.w(P + "ffn_gate_inp.weight").t()
        p = torch.sigmoid(z)
        sel = torch.topk(p.detach() + self.buffers_[P + "exp_probs_b.bias"], self.k, dim=-1).indices
        wts = p.gather(-1, sel)
        if self.wnorm:
            wts = wts / wts.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
        if self.wscale not in (0.0, 1.0):
            wts = wts * self.wscale
        xl = x @ self.w(P + "ffn_routed_down.weight").t() if self.has(P + "ffn_routed_down.weight") else x
        Wg, Wu, Wd = (self.w(P + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        m = xl.new_zeros(xl.shape)
        counts = torch.bincount(sel.reshape(-1), minlength=self.E)
        loads[il] = counts
        for e in range(self.E):
            rows, slot = (sel == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = xl[rows]
            r = situ(xe @ Wg[e].t(), xe @ Wu[e].t(), self.beta, self.beta_lin) @ Wd[e].t()
            m = m.index_add(0, rows, r * wts[rows, slot].unsqueeze(-1))
        if self.has(P + "ffn_routed_norm.weight"):
            m = rms_norm(m, self.w(P + "ffn_routed_norm.weight"), self.eps)
        if self.has(P + "ffn_routed_up.weight"):
            m = m @ self.w(P + "ffn_routed_up.weight").t()
        if self.has(P + "ffn_gate_shexp.weight"):
            m = m + self.ffn_dense(P, x, "_shexp")
        return m.reshape(shape)

    # ---- the whole pass ----------------------------------------------------------------------------

    def forward(self, tokens, taps=(), loads=None):
        """tokens [B, T] -> logits [B, T, V]; with taps (layer ids), also the stream h entering each of
        those layers (what a DSpark draft is fed), as a list in the given order."""
        loads = {} if loads is None else loads
        h = self.w("token_embd.weight")[tokens]
        stack = []
        tapped = {}
        for il in range(self.L):
            P = f"blk.{il}."
            if il in taps:
                tapped[il] = h
            x = self.resmix(h, stack, self.w(P + "attn_res_score.weight")) if self.B > 0 else h
            banked = self.B > 0 and il % self.B == 0
            if banked:
                stack = stack + [h]
            xn = rms_norm(x, self.w(P + "attn_norm.weight"), self.eps)
            a = self.mla(il, xn) if self.is_mla[il] else self.kda(il, xn)
            h = a if banked else h + a
            y = self.resmix(h, stack, self.w(P + "ffn_res_score.weight")) if self.B > 0 else h
            yn = rms_norm(y, self.w(P + "ffn_norm.weight"), self.eps)
            h = h + (self.ffn_dense(P, yn, "") if il < self.n_dense else self.moe(il, yn, loads))
        if self.L in taps:
            tapped[self.L] = h
        z = self.resmix(h, stack, self.w("output_res_score.weight")) if self.B > 0 else h
        logits = rms_norm(z, self.w("output_norm.weight"), self.eps) @ self.w("output.weight").t()
        return (logits, [tapped[t] for t in taps]) if taps else logits

    def balance(self, loads, rate):
        """Auxiliary-loss-free balancing: raise the selection bias of under-loaded experts, lower it for the
        over-loaded, by a fixed step."""
        for il, counts in loads.items():
            b = self.buffers_[f"blk.{il}.exp_probs_b.bias"]
            c = counts.float()
            b += rate * torch.sign(c.mean() - c)
