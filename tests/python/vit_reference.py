"""ViT reference outputs from transformers for tests/apps/vit/vit_hf_test.cpp (nothing is downloaded).

  vit_reference.py build OUT   a tiny random ViTForImageClassification saved with save_pretrained into
                               OUT/hf, its ViTModel backbone into OUT/backbone, and OUT/reference.safetensors:
                               logits, loss and gradients for a batch of random images
  vit_reference.py check DIR EXPECTED
                               loads DIR (a folder Kuafu wrote) with from_pretrained and prints the largest
                               difference between its logits and EXPECTED's on EXPECTED's images
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import ViTConfig, ViTForImageClassification

# Parameter name in transformers 5's modules -> the name its files (and Kuafu) use.
GRADIENTS = {"vit.embeddings.patch_embeddings.projection.weight": "vit.embeddings.patch_embeddings.projection.weight",
             "vit.embeddings.cls_token": "vit.embeddings.cls_token",
             "vit.layers.0.attention.q_proj.weight": "vit.encoder.layer.0.attention.attention.query.weight",
             "vit.layers.1.mlp.fc2.bias": "vit.encoder.layer.1.output.dense.bias",
             "classifier.weight": "classifier.weight"}


def build(out):
    out = pathlib.Path(out)
    torch.manual_seed(0)
    config = ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0, num_labels=5)
    model = ViTForImageClassification(config).eval()
    with torch.no_grad():
        # LayerNorms start at ones and zeros, biases and the class token at zero: random values make a
        # swapped or skipped tensor show in the outputs.
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("bias") or "cls_token" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "layernorm" in name and name.endswith("weight") else 0.0))
    model.save_pretrained(out / "hf")
    model.vit.save_pretrained(out / "backbone")

    pixels = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 3, 4, 1])
    result = model(pixel_values=pixels, labels=labels)
    result.loss.backward()
    named = dict(model.named_parameters())
    reference = {"pixels": pixels, "labels": labels, "logits": result.logits.detach().contiguous(),
                 "loss": result.loss.detach().reshape(1)}
    for name, stored in GRADIENTS.items():
        reference["grad." + stored] = named[name].grad.contiguous()
    save_file(reference, str(out / "reference.safetensors"))


def check(folder, expected_path):
    expected = load_file(expected_path)
    model = ViTForImageClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(pixel_values=expected["pixels"]).logits
    diff = (logits - expected["logits"]).abs().max().item()
    print(json.dumps({"max_abs_diff": diff, "labels": model.config.id2label}))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: vit_reference.py build OUT | check DIR EXPECTED")
