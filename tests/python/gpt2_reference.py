"""GPT-2 reference outputs from transformers for tests/apps/gpt/gpt_hf_test.cpp (nothing is downloaded).

  gpt2_reference.py build OUT   a tiny random GPT2LMHeadModel saved with save_pretrained into OUT/hf (one
                                file) and OUT/hf_sharded (shards + index), and OUT/reference.safetensors:
                                logits of a left-padded batch, loss and gradients of an unpadded one, and
                                greedy generation from the padded batch
  gpt2_reference.py check DIR EXPECTED
                                loads DIR (a folder Kuafu wrote) with from_pretrained and prints the largest
                                difference between its logits and EXPECTED's on EXPECTED's inputs
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

GRADIENTS = ["transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.bias",
             "transformer.ln_f.weight"]


def padded_batch():
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 9]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    return ids, mask


def positions(mask):
    # Each row's count of real tokens before each one (Kuafu's rule, and generate()'s in transformers).
    return (mask.cumsum(-1) - 1).clamp(min=0)


def build(out):
    out = pathlib.Path(out)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=96, eos_token_id=96)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        # LayerNorms start at ones and zeros and biases at zero: random values make a swapped or
        # skipped tensor show in the outputs.
        for name, p in model.named_parameters():
            if ".ln_" in name or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
    model.save_pretrained(out / "hf")
    model.save_pretrained(out / "hf_sharded", max_shard_size="20KB")

    ids, mask = padded_batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)[:, ids.shape[1]:]
    tokens = torch.randint(0, 97, (3, 10), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=tokens, labels=tokens).loss  # predicts tokens[:, 1:] from tokens[:, :-1]
    loss.backward()
    named = dict(model.named_parameters())
    reference = {"ids": ids, "mask": mask, "logits": logits.contiguous(), "generated": generated.contiguous(),
                 "tokens": tokens, "loss": loss.detach().reshape(1)}
    for name in GRADIENTS:
        reference["grad." + name] = named[name].grad.contiguous()
    save_file(reference, str(out / "reference.safetensors"))


def check(folder, expected_path):
    expected = load_file(expected_path)
    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    ids, mask = expected["ids"], expected["mask"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    real = mask.bool()  # padding's own logits are nobody's business
    diff = (logits - expected["logits"]).abs()[real].max().item()
    print(json.dumps({"max_abs_diff": diff, "parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: gpt2_reference.py build OUT | check DIR EXPECTED")
