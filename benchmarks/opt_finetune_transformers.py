"""The fine-tuning step `kuafu-opt benchmark` times, as a Python loop with Hugging Face transformers'
OPTForCausalLM on the same torch (the checkout's venv), to compare tokens/s on one machine.

A model of the published shape (random weights, built from its config; nothing downloaded), one random
batch of BATCH x CONTEXT tokens, AdamW (or, with `lora`, PEFT's LoRA r 8 on q_proj and v_proj), the loss
transformers computes from `labels`; dropout 0.1 as OPT's config has it, as in Kuafu's. With `bf16` the
model computes in bfloat16 and AdamW steps float32 master copies of the trained weights, copied back
after each step, as Kuafu's precision.dtype = "bf16" does. The median of STEPS timed steps after 2
warm-up steps, synchronised on the device.

usage: .venv/bin/python benchmarks/opt_finetune_transformers.py SHAPE CONTEXT BATCH [STEPS] [THREADS]
           [full|lora] [fp32|bf16] [cpu|cuda]
"""
import json
import statistics
import sys
import time

import torch
from transformers import OPTConfig, OPTForCausalLM

SHAPES = {"125m": (768, 12, 12), "350m": (1024, 24, 16), "1.3b": (2048, 24, 32), "2.7b": (2560, 32, 32)}


def main():
    shape, context, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    torch.set_num_threads(int(sys.argv[5]) if len(sys.argv) > 5 else 2)
    mode = sys.argv[6] if len(sys.argv) > 6 else "full"
    precision = sys.argv[7] if len(sys.argv) > 7 else "fp32"
    device = torch.device(sys.argv[8] if len(sys.argv) > 8 else "cpu")
    hidden, layers, heads = SHAPES[shape]
    config = OPTConfig(vocab_size=50272, hidden_size=hidden, num_hidden_layers=layers, ffn_dim=4 * hidden,
                       num_attention_heads=heads, max_position_embeddings=2048,
                       word_embed_proj_dim=512 if shape == "350m" else hidden, do_layer_norm_before=shape != "350m",
                       dropout=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = OPTForCausalLM(config).to(device).train()
    if precision == "bf16":
        model.to(torch.bfloat16)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0, task_type="CAUSAL_LM"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float().clone().requires_grad_(True) for p in trainable] if precision == "bf16" else None
    opt = torch.optim.AdamW(masters if masters else trainable, lr=1e-5)
    tokens = torch.randint(50265, (batch, context), device=device)
    times = []
    for i in range(steps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        if masters:
            with torch.no_grad():
                for p, m in zip(trainable, masters):
                    m.grad = p.grad.float()
                    p.grad = None
                opt.step()
                for p, m in zip(trainable, masters):
                    p.copy_(m)
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"impl": "transformers", "torch": torch.__version__, "shape": shape, "mode": mode,
                      "precision": precision, "step_time_ms_median": median * 1e3,
                      "tokens_per_s": batch * context / median, "threads": torch.get_num_threads(),
                      "trainable_parameters": sum(p.numel() for p in trainable), "device": str(device)}))


if __name__ == "__main__":
    main()
