"""Llama-family reference outputs from transformers for tests/apps/opt_finetune/llama_hf_test.cpp (nothing is
downloaded): tiny random folders with the shapes that break a decoder written for one family.

  llama_reference.py build OUT   one folder per variant, saved with save_pretrained into OUT/<variant>, and
                                 OUT/<variant>.safetensors: logits of a left-padded batch (position ids
                                 counted over each row's real tokens, as generate counts them), the next-
                                 token loss of an unpadded batch and every parameter's gradient, greedy generation from
                                 the padded batch. Each figure is taken from a freshly loaded model, so the
                                 dynamic rope's cached frequencies carry nothing from one call to the next.
  llama_reference.py check DIR EXPECTED
                                 loads DIR (a folder Kuafu wrote) and prints the largest logit difference

Variants:
  llama         grouped-query attention (6 heads, 2 key-value heads), head_dim 12 != 48 / 6, llama3 rope
                (medium frequencies on the ramp), untied head, attention and MLP biases
  llama_dynamic dynamic NTK rope past a context of 8 (the loss batch and the generation run past it), tied head
  llama_linear  linear rope scaling (factor 3), one key-value head per query head, tied head
  qwen2         q/k/v biases (no output bias), tied head, the second layer sliding over 4 keys
  qwen3         q/k RMSNorm per head, head_dim 16, untied head
  mistral       sliding window of 5 keys on every layer, shorter than every sequence here
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

VOCAB = 97
COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2, rms_norm_eps=1e-5,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)


def variants():
    return {
        "llama": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_attention_heads=6, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
            tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
        "llama_dynamic": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=8,
            tie_word_embeddings=True, rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 2.0})),
        "llama_linear": (LlamaForCausalLM, LlamaConfig(
            **COMMON, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
            tie_word_embeddings=True, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0})),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            **COMMON, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
            use_sliding_window=True, sliding_window=4, max_window_layers=1, rope_parameters={"rope_type": "default",
                                                                                             "rope_theta": 1e6})),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            **COMMON, num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
            tie_word_embeddings=False)),
        "mistral": (MistralForCausalLM, MistralConfig(
            **COMMON, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64, sliding_window=5,
            tie_word_embeddings=False)),
    }


def padded_batch():
    ids = torch.tensor([[0, 0, 0, 1, 5, 6, 7, 8, 9], [1, 3, 4, 5, 6, 7, 9, 11, 12]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1]])
    return ids, mask


def positions_of(mask):
    # As generate counts them: real tokens from 0, padding at 1 (masked anyway).
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def build_variant(out, name, cls, config):
    torch.manual_seed(len(name))
    config.attention_dropout = 0.0
    model = cls(config).eval()
    with torch.no_grad():
        # Norms start at one and biases at zero: random values make a swapped or skipped tensor show.
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in pname else 0.0))
    folder = out / name
    model.save_pretrained(folder)

    def fresh():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    ids, mask = padded_batch()
    reference = {"ids": ids, "mask": mask}
    with torch.no_grad():
        reference["logits"] = fresh()(input_ids=ids, attention_mask=mask, position_ids=positions_of(mask)).logits
        reference["generated"] = fresh().generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                                  pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
    tokens = torch.randint(3, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    trained = fresh()
    # The next-token loss of the first 11 tokens as the inputs (the dynamic rope's base depends on the
    # length of the call, so the 12th token is not run through the model as labels=tokens would).
    logits = trained(input_ids=tokens[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    reference["tokens"] = tokens
    reference["loss"] = loss.detach().reshape(1)
    for pname, p in trained.named_parameters():
        reference["grad." + pname] = p.grad.contiguous()
    save_file({k: v.contiguous() for k, v in reference.items()}, str(out / (name + ".safetensors")))


def check(folder, expected_path):
    expected = load_file(expected_path)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    mask = expected["mask"]
    with torch.no_grad():
        logits = model(input_ids=expected["ids"], attention_mask=mask, position_ids=positions_of(mask)).logits
    diff = (logits - expected["logits"]).abs()[mask.bool()].max().item()
    print(json.dumps({"max_abs_diff": diff, "class": type(model).__name__}))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        out = pathlib.Path(sys.argv[2])
        for name, (cls, config) in variants().items():
            build_variant(out, name, cls, config)
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: llama_reference.py build OUT | check DIR EXPECTED")
