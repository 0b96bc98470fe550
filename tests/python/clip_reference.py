"""CLIP's tokenizer from transformers for tests/apps/stable_diffusion/clip_test.cpp (nothing is downloaded).

  clip_reference.py build OUT
      OUT/tokenizer: a tiny CLIPTokenizer folder as Stable Diffusion ships one (vocab.json with the 256
      byte symbols, each also ending in </w>, a few merges and the two special tokens; merges.txt;
      tokenizer_config.json naming CLIPTokenizer; special_tokens_map.json), and
      OUT/reference.safetensors: ids_I, AutoTokenizer's ids of TEXTS[I] with padding="max_length",
      max_length=77, truncation=True (texts.json lists them); OUT/tokenizer_pad, the same folder padding
      with "!" as SD 2.x's does (transformers then matches "!" whole as a special token), and pad_ids, its
      ids of PAD_TEXT;
      OUT/text_quick_gelu, OUT/text_gelu: tiny random CLIPTextModel folders (SD 1.x's quick GELU with the old
      eos_token_id 2, pooled at the highest id; SD 2.x's GELU with eos_token_id <|endoftext|>, pooled at
      its first), OUT/text_projection: a tiny random CLIPTextModelWithProjection (SDXL's second encoder: GELU,
      3 layers, projection_dim 24), and <name>_hidden, <name>_pooled, <name>_penultimate: their last hidden
      states, pooled outputs (text_projection's: its text_embeds) and hidden_states[-2] on ids_0..3
  clip_reference.py check_text DIR EXPECTED
      loads DIR (a folder Kuafu wrote) with CLIPTextModel.from_pretrained (CLIPTextModelWithProjection where
      its architectures say so) and prints, as JSON, the largest difference of those three outputs on
      EXPECTED's ids from EXPECTED's
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import save_file
from safetensors.torch import load_file
from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

TEXTS = ["A photo of the Cat!!", "  many   spaces\tand\nlines ", "it's 1234 café 😀 THE", "",
         " ".join(["photo"] * 100), "<|startoftext|>the cat<|endoftext|>", "Ǆemo ÅNGSTRÖM ﬁne"]
PAD_TEXT = "wow!! the"
MERGES = [("t", "h"), ("th", "e</w>"), ("c", "a"), ("ca", "t</w>"), ("p", "h"), ("ph", "o"), ("pho", "t"), ("phot", "o</w>")]


def bytes_to_unicode():
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    codes, extra = {}, 256
    for b in range(256):
        if b in printable:
            codes[b] = chr(b)
        else:
            codes[b] = chr(extra)
            extra += 1
    return codes


def write_tokenizer(out, pad="<|endoftext|>"):
    out.mkdir(parents=True, exist_ok=True)
    symbols = list(bytes_to_unicode().values())
    vocab = {}
    for s in symbols + [s + "</w>" for s in symbols] + [l + r for l, r in MERGES] + ["<|startoftext|>", "<|endoftext|>"]:
        vocab.setdefault(s, len(vocab))
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{l} {r}" for l, r in MERGES) + "\n")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": pad,
               "unk_token": "<|endoftext|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(dict(special, tokenizer_class="CLIPTokenizer", model_max_length=77,
                                                               do_lower_case=True)))
    (out / "special_tokens_map.json").write_text(json.dumps(special))


def build(out):
    out = pathlib.Path(out)
    write_tokenizer(out / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    tensors = {f"ids_{i}": torch.tensor(tokenizer(text, padding="max_length", max_length=77, truncation=True).input_ids)
               for i, text in enumerate(TEXTS)}
    (out / "texts.json").write_text(json.dumps(TEXTS))
    write_tokenizer(out / "tokenizer_pad", pad="!")
    tensors["pad_ids"] = torch.tensor(AutoTokenizer.from_pretrained(out / "tokenizer_pad")(
        PAD_TEXT, padding="max_length", max_length=77, truncation=True).input_ids)
    ids = torch.stack([tensors[f"ids_{i}"] for i in range(4)])
    tensors["text_ids"] = ids
    for seed, (name, act, eos) in enumerate((("text_quick_gelu", "quick_gelu", 2), ("text_gelu", "gelu", 521),
                                             ("text_projection", "gelu", 521))):
        torch.manual_seed(seed)
        projection = name == "text_projection"
        config = CLIPTextConfig(vocab_size=522, hidden_size=32, intermediate_size=64, num_hidden_layers=3 if projection else 2,
                                num_attention_heads=4, max_position_embeddings=77, hidden_act=act, eos_token_id=eos, bos_token_id=520,
                                pad_token_id=521, projection_dim=24)
        model = (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()
        with torch.no_grad():  # LayerNorms and biases away from ones and zeros: a swapped tensor shows
            for key, p in model.named_parameters():
                if "layer_norm" in key or key.endswith("bias"):
                    p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "layer_norm" in key and key.endswith("weight") else 0.0))
        model.save_pretrained(out / name)
        tensors[f"{name}_hidden"], tensors[f"{name}_pooled"], tensors[f"{name}_penultimate"] = outputs(model, ids)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors")


def outputs(model, ids):
    with torch.no_grad():
        o = model(input_ids=ids, output_hidden_states=True)
    pooled = o.text_embeds if isinstance(model, CLIPTextModelWithProjection) else o.pooler_output
    return o.last_hidden_state, pooled, o.hidden_states[-2]


def check_text(folder, expected):
    e = load_file(expected)
    architectures = json.loads((pathlib.Path(folder) / "config.json").read_text()).get("architectures", [])
    kind = CLIPTextModelWithProjection if architectures == ["CLIPTextModelWithProjection"] else CLIPTextModel
    got = outputs(kind.from_pretrained(folder).eval(), e["ids"])
    diff = max((g - e[k]).abs().max().item() for g, k in zip(got, ("hidden", "pooled", "penultimate")))
    print(json.dumps({"max_difference": diff}))


if __name__ == "__main__":
    commands = {"build": build, "check_text": check_text}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
