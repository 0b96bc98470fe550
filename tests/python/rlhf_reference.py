"""RLHF numerics for tests/apps/chat_rlhf/rl_math_test.cpp, from trl and transformers where they have standalone
functions and otherwise from the published formulas, transcribed here loop by loop (not vectorised as the
C++ is), all in float64.

  rlhf_reference.py losses IN OUT   reads the inputs IN (safetensors the test wrote) and writes OUT:
      logprobs      trl.trainer.utils.selective_log_softmax(logits, tokens, temperature)
      logprobs_topk the most likely tokens' after transformers' TopKLogitsWarper(4) and TopPLogitsWarper(0.9), as generate
                    applies them after the temperature
      entropy       trl.trainer.utils.entropy_from_logits(logits / temperature)
      k1, k2, k3    Schulman's KL estimators (k3 as trl's GRPOTrainer writes it)
      token_rewards the score on the last real token, -kl_coef * k1 on every real token
      advantages, returns   GAE (Schulman et al., 2016) row by row, bootstrapped past a cut response
      whitened      masked (x - mean) / sqrt(unbiased var + 1e-8), as trl's former masked_whiten
      policy_loss, policy_clipped, value_loss   PPO's clipped losses per token (Schulman et al., 2017)
      token_mean, sequence_mean, constant       the three aggregations of policy_loss
      grpo_group, grpo_batch, grpo_none         GRPO advantages as trl's GRPOTrainer computes them
      dpo, ipo, pairwise   DPO (Rafailov et al.), IPO (Azar et al.) and the Bradley-Terry reward loss
      ipo_per_token        IPO as trl 1.16 computes it: the ratios averaged over the completions' tokens nc, nr
      score_std_scaled<b>, score_norm_clipped<b>   three batches of scores through trl 0.11's running-moments
                           score scaling (divided by the running std; less the running mean, then clipped)
"""
import math
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
from trl.trainer.utils import entropy_from_logits, selective_log_softmax


def losses(inputs, out):
    x = load_file(inputs)
    s = {k: v.item() for k, v in x.items() if v.dim() == 0}
    temperature = s["temperature"]
    r = {}
    logits, tokens = x["logits"], x["tokens"]
    r["logprobs"] = selective_log_softmax(logits, tokens, temperature=temperature)
    warped = logits / temperature
    flat = warped.reshape(-1, warped.size(-1))
    flat = TopPLogitsWarper(top_p=0.9)(None, TopKLogitsWarper(top_k=4)(None, flat))
    r["logprobs_topk"] = selective_log_softmax(flat.view_as(warped), x["top_tokens"])
    r["entropy"] = entropy_from_logits(logits / temperature)

    logp, ref, old = x["logp"], x["ref_logp"], x["old_logp"]
    mask = x["mask"].bool()
    rows, length = mask.shape
    r["k1"] = logp - ref
    r["k2"] = 0.5 * (ref - logp) ** 2
    r["k3"] = torch.exp(ref - logp) - (ref - logp) - 1

    # Per-token rewards and GAE, one row at a time over its real tokens.
    score, values, bootstrap = x["score"], x["values"], x["bootstrap"]
    rewards = torch.zeros(rows, length, dtype=torch.float64)
    advantages = torch.zeros(rows, length, dtype=torch.float64)
    returns = torch.zeros(rows, length, dtype=torch.float64)
    gamma, lam, kl_coef = s["gamma"], s["lambda"], s["kl_coef"]
    for b in range(rows):
        n = int(mask[b].sum())
        for t in range(n):
            rewards[b, t] = -kl_coef * (logp[b, t] - ref[b, t])
        if n > 0:
            rewards[b, n - 1] += score[b]
        last = 0.0
        for t in reversed(range(n)):
            next_value = values[b, t + 1] if t + 1 < n else bootstrap[b]
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            last = delta + gamma * lam * last
            advantages[b, t] = last
            returns[b, t] = last + values[b, t]
    r["token_rewards"], r["advantages"], r["returns"] = rewards, advantages, returns

    real = advantages[mask]
    mean = real.mean()
    var = ((real - mean) ** 2).sum() / (real.numel() - 1)
    r["whitened"] = torch.where(mask, (advantages - mean) * torch.rsqrt(var + 1e-8), torch.zeros_like(advantages))

    a = x["adv"]
    ratio = torch.exp(logp - old)
    loss1 = -a * ratio
    loss2 = -a * torch.clamp(ratio, 1 - s["clip_low"], 1 + s["clip_high"])
    r["policy_loss"] = torch.max(loss1, loss2)
    r["policy_clipped"] = (loss2 > loss1).double()
    # GSPO as trl 1.16's GRPOTrainer takes it (importance_sampling_level="sequence"): the mean log-ratio over
    # each response's real tokens, and the gradient of the sequence-mean loss with respect to logp.
    lp = logp.clone().requires_grad_()
    m = mask.double()
    seq = (((lp - old) * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(seq)
    coef_2 = torch.clamp(coef_1, 1 - s["clip_low"], 1 + s["clip_high"])
    gspo = -torch.min(coef_1 * a, coef_2 * a)
    r["gspo_loss"] = gspo.detach()
    ((gspo * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean().backward()
    r["gspo_grad"] = lp.grad
    v, old_v, target = x["v"], x["old_v"], x["ret"]
    clipped_v = torch.clamp(v, old_v - s["value_clip"], old_v + s["value_clip"])
    r["value_loss"] = 0.5 * torch.max((v - target) ** 2, (clipped_v - target) ** 2)

    per_token, m = r["policy_loss"], mask.double()
    r["token_mean"] = (per_token * m).sum() / m.sum()
    r["sequence_mean"] = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    r["constant"] = (per_token * m).sum() / (rows * int(s["max_length"]))

    g = int(s["group_size"])
    rw = x["grpo_rewards"]
    group_mean = rw.view(-1, g).mean(1).repeat_interleave(g)
    group_std = rw.view(-1, g).std(1).repeat_interleave(g)
    r["grpo_group"] = (rw - group_mean) / (group_std + 1e-4)
    r["grpo_batch"] = (rw - group_mean) / (rw.std() + 1e-4)
    r["grpo_none"] = rw - group_mean

    beta = s["beta"]
    h = (x["pc"] - x["rc"]) - (x["pr"] - x["rr"])
    r["dpo"] = -F.logsigmoid(beta * h)
    r["ipo"] = (h - 1 / (2 * beta)) ** 2
    # trl 1.16's DPOTrainer (loss_type "ipo"): each side's ratio averaged over its completion's tokens.
    chosen_avg = (x["pc"] - x["rc"]) / x["nc"].clamp(min=1.0)
    rejected_avg = (x["pr"] - x["rr"]) / x["nr"].clamp(min=1.0)
    r["ipo_per_token"] = (chosen_avg - rejected_avg - 1 / (2 * beta)) ** 2
    r["pairwise"] = -F.logsigmoid(x["chosen"] - x["rejected"] - s["margin"])

    # trl 0.11's PPOTrainer score scaling (RunningMoments, use_score_scaling / use_score_norm / score_clip),
    # transcribed: each batch merged into the running moments, then the batch scaled by them.
    count, mean, var, std = 1e-24, 0.0, 1.0, 1.0
    for b in range(3):
        xs = x[f"score_batch{b}"]
        xs_var, xs_mean = torch.var_mean(xs, unbiased=False)
        xs_count = xs.numel()
        delta = xs_mean.item() - mean
        tot_count = count + xs_count
        new_sum = xs_var.item() * xs_count
        old_sum = var * count + delta ** 2 * count * xs_count / tot_count
        mean += delta * xs_count / tot_count
        var = (old_sum + new_sum) / tot_count
        std = math.sqrt(var * tot_count / (tot_count - 1))
        count = tot_count
        factor = std + torch.finfo(torch.float32).eps
        r[f"score_std_scaled{b}"] = xs / factor
        r[f"score_norm_clipped{b}"] = torch.clip((xs - mean) / factor, -s["score_clip"], s["score_clip"])
    save_file({k: v.contiguous().to(torch.float64) for k, v in r.items()}, out)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "losses":
        losses(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
