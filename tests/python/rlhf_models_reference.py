"""Reward and policy models from transformers for tests/apps/chat_rlhf/chat_models_test.cpp (nothing is downloaded).

  rlhf_models_reference.py build OUT
      OUT/rm: a tiny random OPTForSequenceClassification (one label, pad 1), saved with save_pretrained;
      OUT/lm: a tiny random OPTForCausalLM of the same shape;
      OUT/gpt2_rm, OUT/gpt2_lm: the same for GPT-2 (GPT2ForSequenceClassification, GPT2LMHeadModel);
      OUT/reference.safetensors: a batch left-padded (left_ids, left_mask) and the same rows right-padded
      (right_ids, right_mask), the reward models' scores of each (transformers pools the rightmost non-pad
      token), and the causal models' log-probabilities of each next real token, left-padded (lm_logprobs,
      gpt2_ prefixed for GPT-2). GPT-2 takes each row's positions from its real tokens (position_ids =
      cumsum(mask) - 1, as transformers' generate passes them); OPT computes them so itself.
  rlhf_models_reference.py gpt2_start OUT
      a tiny random GPT2LMHeadModel (128-token vocabulary, 64 positions) saved in OUT: a GPT-2 folder a
      chat pipeline starts from
  rlhf_models_reference.py llama_start OUT
      the same for the Llama family: a tiny random LlamaForCausalLM (grouped-query attention, head_dim 12 of
      hidden 32 with 4 heads, untied head, BOS = EOS = 0, no pad token)
  rlhf_models_reference.py llama2_start OUT JSONL
      a Llama 2 folder as Meta publishes one, tiny: a SentencePiece tokenizer.model trained with the
      `sentencepiece` library on JSONL's prompts and responses (BPE, byte fallback, Llama 2's trainer
      settings) and no tokenizer.json, tokenizer_config.json naming LlamaTokenizer with a Llama 2-style chat
      template ([INST] ... [/INST]), and a tiny random LlamaForCausalLM over its pieces (BOS 1, EOS 2)
  rlhf_models_reference.py llama2_answer DIR PROMPT MAX_NEW
      transformers' greedy answer to PROMPT from DIR: AutoTokenizer's apply_chat_template with the generation
      prompt, generate (at most MAX_NEW new tokens, stopping at EOS), the new tokens decoded without special
      tokens; prints it as JSON with the prompt's ids and which tokenizer files DIR holds
  rlhf_models_reference.py check_rm DIR EXPECTED
      loads DIR (a folder Kuafu wrote) with AutoModelForSequenceClassification and prints, as JSON, the
      largest difference of its scores on both batches from EXPECTED's (what Kuafu computed); a folder
      without pad_token_id (GPT-2 has no pad token) is scored a row at a time, each row's real tokens
      alone, as transformers requires
  rlhf_models_reference.py ppo_update DIR IN OUT
      one PPO update's losses and gradients, transcribed from the papers in plain PyTorch on transformers'
      models: DIR/lm the actor, DIR/rm's decoder and score head the critic (a value at every position), on
      IN's fixed experience (rows with left-padded prompts and right-padded responses, old log-probs,
      values, advantages, returns); OUT: the policy and value losses and named gradients
  rlhf_models_reference.py check_lm DIR EXPECTED
      loads DIR with AutoModelForCausalLM and prints the largest difference of its next-token
      log-probabilities on the left-padded batch from EXPECTED's lm_logprobs
  rlhf_models_reference.py check_peft BASE ADAPTER EXPECTED
      the same for the PEFT adapter folder ADAPTER (Kuafu wrote it) on BASE, with PeftModel.from_pretrained
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, GPT2Config, GPT2ForSequenceClassification, \
    GPT2LMHeadModel, OPTConfig, OPTForCausalLM, OPTForSequenceClassification


def config():
    return OPTConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                     max_position_embeddings=32, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
                     pad_token_id=1, bos_token_id=2, eos_token_id=2, num_labels=1)


def gpt2_config(**extra):
    return GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, bos_token_id=2, eos_token_id=2, **extra)


def run(model, ids, mask):
    """The model's outputs on rows with padding anywhere, each token at its position among the row's real ones."""
    if model.config.model_type in ("gpt2", "llama", "qwen2", "qwen3", "mistral"):
        return model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    return model(input_ids=ids, attention_mask=mask)


def randomise(model):
    # LayerNorms and biases away from their initial ones and zeros: a swapped or skipped tensor shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "layer_norm" in name or "ln_" in name
            if norm or name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if norm and name.endswith("weight") else 0.0))


def batches():
    rows = [[2, 5, 6, 7, 8, 9, 2], [2, 11, 12, 2], [2, 20, 21, 22, 23, 2]]  # </s> prompt ... </s> (EOS)
    width = max(map(len, rows))
    pad = 1
    left = [[pad] * (width - len(r)) + r for r in rows]
    right = [r + [pad] * (width - len(r)) for r in rows]
    mask_left = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    mask_right = [[1] * len(r) + [0] * (width - len(r)) for r in rows]
    return {"left_ids": torch.tensor(left), "left_mask": torch.tensor(mask_left),
            "right_ids": torch.tensor(right), "right_mask": torch.tensor(mask_right)}


def scores(model, b):
    with torch.no_grad():
        return {side: run(model, b[f"{side}_ids"], b[f"{side}_mask"]).logits.squeeze(-1) for side in ("left", "right")}


def scores_row_by_row(model, b):
    """Scores of each row's real tokens alone (a batch of one: transformers needs no pad token for it)."""
    out = {}
    with torch.no_grad():
        for side in ("left", "right"):
            rows = [ids[mask.bool()].unsqueeze(0) for ids, mask in zip(b[f"{side}_ids"], b[f"{side}_mask"])]
            out[side] = torch.cat([model(input_ids=r).logits.squeeze(-1) for r in rows])
    return out


def next_token_logprobs(model, b):
    with torch.no_grad():
        logits = run(model, b["left_ids"], b["left_mask"]).logits[:, :-1]
    return torch.log_softmax(logits, -1).gather(-1, b["left_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)


def build(out):
    out = pathlib.Path(out)

    def saved(seed, make, name):
        torch.manual_seed(seed)
        model = make().eval()
        randomise(model)
        model.save_pretrained(out / name)
        return model

    rm = saved(0, lambda: OPTForSequenceClassification(config()), "rm")
    lm = saved(1, lambda: OPTForCausalLM(config()), "lm")
    gpt2_rm = saved(2, lambda: GPT2ForSequenceClassification(gpt2_config(num_labels=1, pad_token_id=1)), "gpt2_rm")
    gpt2_lm = saved(3, lambda: GPT2LMHeadModel(gpt2_config()), "gpt2_lm")
    b = batches()
    s = scores(rm, b)
    g = scores(gpt2_rm, b)
    tensors = dict(b, left_scores=s["left"], right_scores=s["right"], lm_logprobs=next_token_logprobs(lm, b),
                   gpt2_left_scores=g["left"], gpt2_right_scores=g["right"], gpt2_lm_logprobs=next_token_logprobs(gpt2_lm, b))
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def gpt2_start(out):
    torch.manual_seed(4)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    model.save_pretrained(out)


def llama_start(out):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(5)
    # Grouped-query attention, heads wider than hidden / heads, an untied head; no pad token (BOS = EOS = 0).
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                         max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=0,
                                         eos_token_id=0, pad_token_id=None))
    model.save_pretrained(out)


LLAMA2_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
                   "{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}")


def llama2_start(out, jsonl):
    import sentencepiece
    from transformers import LlamaConfig, LlamaForCausalLM
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in pathlib.Path(jsonl).read_text().splitlines()]
    text = out.parent / "llama2_text.txt"
    text.write_text("".join(r["prompt"] + " " + r["response"] + "\n" for r in rows))
    sentencepiece.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(out / "tokenizer"), model_type="bpe", vocab_size=320, hard_vocab_limit=False,
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    (out / "tokenizer.vocab").unlink()
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(out / "tokenizer.model")).get_piece_size()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "legacy": False, "chat_template": LLAMA2_TEMPLATE}))
    torch.manual_seed(6)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=pieces, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=None))
    model.save_pretrained(out)


def llama2_answer(folder, prompt, max_new):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=int(max_new), eos_token_id=2,
                             pad_token_id=2)
    new = out[0, len(ids):].tolist()
    print(json.dumps({"answer": tokenizer.decode(new, skip_special_tokens=True), "prompt_ids": ids, "new_ids": new,
                      "files": sorted(p.name for p in pathlib.Path(folder).iterdir() if p.name.startswith("tokenizer"))}))


def check_rm(folder, expected):
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    e = load_file(expected)
    s = scores(model, e) if model.config.pad_token_id is not None else scores_row_by_row(model, e)
    diff = max((s[side] - e[f"{side}_scores"]).abs().max().item() for side in ("left", "right"))
    print(json.dumps({"max_difference": diff, "architecture": type(model).__name__}))


def check_lm(folder, expected):
    check_lm_model(AutoModelForCausalLM.from_pretrained(folder).eval(), expected)


def check_lm_model(model, expected):
    e = load_file(expected)
    real = (e["left_mask"][:, 1:] * e["left_mask"][:, :-1]).bool()
    diff = (next_token_logprobs(model, e) - e["lm_logprobs"])[real].abs().max().item()
    print(json.dumps({"max_difference": diff, "architecture": type(model).__name__}))


def check_peft(base, adapter, expected):
    from peft import PeftModel
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    check_lm_model(model, expected)


def ppo_update(folder, inputs, out):
    e = load_file(inputs)
    s = {k: v.item() for k, v in e.items() if v.dim() == 0}
    actor = AutoModelForCausalLM.from_pretrained(pathlib.Path(folder) / "lm").eval()
    critic = AutoModelForSequenceClassification.from_pretrained(pathlib.Path(folder) / "rm").eval()
    ids, mask = e["tokens"], e["real"].long()
    starts, lengths = e["response_start"], e["response_length"]
    rows, width = e["old_logprobs"].shape
    logp_all = torch.log_softmax(actor(input_ids=ids, attention_mask=mask).logits.float(), -1)
    values_all = critic.score(critic.model(input_ids=ids, attention_mask=mask).last_hidden_state).squeeze(-1)
    policy_terms, value_terms = [], []
    for b in range(rows):
        for t in range(int(lengths[b])):
            col = int(starts[b]) + t
            logp = logp_all[b, col - 1, ids[b, col]]  # the token at col, predicted at col - 1
            ratio = torch.exp(logp - e["old_logprobs"][b, t])
            a = e["advantages"][b, t]
            policy_terms.append(torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - s["clip"], 1 + s["clip"])))
            v, old, ret = values_all[b, col - 1], e["old_values"][b, t], e["returns"][b, t]
            clipped = old + torch.clamp(v - old, -s["value_clip"], s["value_clip"])
            value_terms.append(0.5 * torch.max((v - ret) ** 2, (clipped - ret) ** 2))
    policy_loss = torch.stack(policy_terms).mean()  # a token mean over the batch
    value_loss = torch.stack(value_terms).mean()
    (policy_loss + value_loss).backward()
    result = {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach()}
    for prefix, model in (("actor.", actor), ("critic.", critic)):
        for name, p in model.named_parameters():
            if p.grad is not None and ("layers.1.fc2" in name or "embed_positions" in name or name == "score.weight"):
                result[prefix + name] = p.grad
    save_file({k: v.contiguous().double() for k, v in result.items()}, out)


if __name__ == "__main__":
    commands = {"build": build, "gpt2_start": gpt2_start, "llama_start": llama_start, "llama2_start": llama2_start, "llama2_answer": llama2_answer, "check_rm": check_rm, "check_lm": check_lm, "check_peft": check_peft, "ppo_update": ppo_update}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
