"""OPT reference outputs from transformers for tests/apps/opt_finetune/opt_hf_test.cpp (nothing is downloaded).

  opt_reference.py build OUT   two tiny random OPTForCausalLM: "pre" (pre-LN, final layer norm) and "post"
                               (opt-350m's shape: post-LN, no final layer norm, word_embed_proj_dim 16 of
                               hidden 32, so project_in/project_out), saved with save_pretrained into
                               OUT/<variant>, "pre"'s bare OPTModel into OUT/pre_bare, and
                               OUT/<variant>.safetensors: logits of a left-padded batch (transformers takes
                               the positions from the attention mask), loss and gradients of an unpadded
                               batch, greedy generation from the padded batch
  opt_reference.py check DIR EXPECTED
                               loads DIR (a folder Kuafu wrote) and prints the largest logit difference
  opt_reference.py peft BASE ADAPTER EXPECTED
                               loads the PEFT adapter folder ADAPTER (Kuafu wrote it) onto BASE with
                               PeftModel.from_pretrained and prints the largest logit difference
  opt_reference.py peft_build BASE OUT
                               a PEFT LoRA (r 4, alpha 8, q_proj/v_proj/fc1) on BASE with random A and B,
                               saved with save_pretrained into OUT/adapter, and OUT/adapter.safetensors:
                               its logits on the left-padded batch
  opt_reference.py count NAME,HIDDEN,LAYERS,HEADS,EMBED_DIM,PRE_LN ...
                               each shape's parameter count in OPTForCausalLM, built on the meta device
                               (no memory), the tied head counted once
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import OPTConfig, OPTForCausalLM

GRADIENTS = ["model.decoder.embed_tokens.weight", "model.decoder.embed_positions.weight",
             "model.decoder.layers.0.self_attn.q_proj.weight", "model.decoder.layers.1.fc2.bias"]


def padded_batch():
    ids = torch.tensor([[1, 1, 1, 2, 5, 6, 7], [2, 3, 4, 5, 6, 7, 9]])  # 1 is OPT's pad, 2 its </s> BOS
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    return ids, mask


def build_variant(out, name, pre_ln):
    torch.manual_seed(0 if pre_ln else 1)
    config = OPTConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                       max_position_embeddings=32, word_embed_proj_dim=32 if pre_ln else 16,
                       do_layer_norm_before=pre_ln, dropout=0.0, attention_dropout=0.0, pad_token_id=1,
                       bos_token_id=2, eos_token_id=2)
    model = OPTForCausalLM(config).eval()
    with torch.no_grad():
        # LayerNorms start at ones and zeros and biases at zero: random values make a swapped or
        # skipped tensor show.
        for pname, p in model.named_parameters():
            if "layer_norm" in pname or pname.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "layer_norm.weight" in pname else 0.0))
    model.save_pretrained(out / name)
    if pre_ln:
        model.model.save_pretrained(out / (name + "_bare"))
    ids, mask = padded_batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=1,
                                   eos_token_id=None)[:, ids.shape[1]:]
    tokens = torch.randint(3, 97, (3, 10), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    named = dict(model.named_parameters())
    reference = {"ids": ids, "mask": mask, "logits": logits.contiguous(), "generated": generated.contiguous(),
                 "tokens": tokens, "loss": loss.detach().reshape(1)}
    for g in GRADIENTS:
        reference["grad." + g] = named[g].grad.contiguous()
    # Labels of -100 (a prompt, a whole row of padding) take no part: the mean is over the rest.
    model.zero_grad()
    labels = tokens.clone()
    labels[0, :5] = -100
    labels[1, :] = -100
    labels[2, 7] = -100
    masked = model(input_ids=tokens, labels=labels).loss
    masked.backward()
    reference["labels"] = labels
    reference["masked_loss"] = masked.detach().reshape(1)
    for g in GRADIENTS:
        reference["masked_grad." + g] = named[g].grad.contiguous()
    save_file(reference, str(out / (name + ".safetensors")))


def check(folder, expected_path):
    expected = load_file(expected_path)
    model = OPTForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(input_ids=expected["ids"], attention_mask=expected["mask"]).logits
    diff = (logits - expected["logits"]).abs()[expected["mask"].bool()].max().item()
    print(json.dumps({"max_abs_diff": diff}))


def peft_logits(base, adapter, ids, mask):
    from peft import PeftModel
    model = PeftModel.from_pretrained(OPTForCausalLM.from_pretrained(base), adapter).eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def peft_check(base, adapter, expected_path):
    expected = load_file(expected_path)
    logits = peft_logits(base, adapter, expected["ids"], expected["mask"])
    diff = (logits - expected["logits"]).abs()[expected["mask"].bool()].max().item()
    print(json.dumps({"max_abs_diff": diff}))


def peft_build(base, out):
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(3)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc1"], lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    model = get_peft_model(OPTForCausalLM.from_pretrained(base), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)  # B starts at zero: random values make it count
    model.save_pretrained(out / "adapter")
    ids, mask = padded_batch()
    save_file({"ids": ids, "mask": mask, "logits": peft_logits(base, str(out / "adapter"), ids, mask).contiguous()},
              str(out / "adapter.safetensors"))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        out = pathlib.Path(sys.argv[2])
        build_variant(out, "pre", True)
        build_variant(out, "post", False)
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "peft":
        peft_check(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "peft_build":
        peft_build(sys.argv[2], pathlib.Path(sys.argv[3]))
    elif sys.argv[1] == "count":
        counts = {}
        for spec in sys.argv[2:]:
            name, hidden, layers, heads, embed, pre_ln = spec.split(",")
            hidden, layers, heads, embed = int(hidden), int(layers), int(heads), int(embed)
            config = OPTConfig(vocab_size=50272, hidden_size=hidden, num_hidden_layers=layers, ffn_dim=4 * hidden,
                               num_attention_heads=heads, max_position_embeddings=2048, word_embed_proj_dim=embed,
                               do_layer_norm_before=pre_ln == "1")
            with torch.device("meta"):
                model = OPTForCausalLM(config)
            counts[name] = sum(p.numel() for p in model.parameters())
        print(json.dumps(counts))
    else:
        sys.exit("usage: opt_reference.py build OUT | check DIR EXPECTED")
