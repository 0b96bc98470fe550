// Test-only models whose blocks do not fit the head -> blocks -> tail shape, for the strategies that
// apply by module (hooks::BlockSites):
//  - UNetToy: down blocks whose outputs are kept as skips for the up blocks, a timestep embedding and a
//    context given to every block, GroupNorm + convolution + cross-attention blocks;
//  - TwoStreamToy: each block updates an MSA-like stream and a pair-like stream, each reading the other
//    (FastFold's Evoformer in miniature).
// Both are float64 maths only; the strategies come from outside. Every tensor a block differentiates
// through is one of its inputs, and each block's body captures by value (a checkpointed block runs it
// again during backward).
#pragma once

#include <torch/torch.h>

#include "core/hooks/block_sites.h"
#include "core/parallel/dap/dap.h"
#include "core/nn/conv.h"
#include "core/nn/cross_attention.h"

namespace kuafu::testing {

// diffusers' ResnetBlock2D in miniature: x [B, Cin, H, W], temb [B, T] -> [B, Cout, H, W].
struct ToyResBlockImpl : torch::nn::Module {
  ToyResBlockImpl(int64_t in, int64_t out, int64_t temb) {
    norm1 = register_module("norm1", torch::nn::GroupNorm(torch::nn::GroupNormOptions(4, in)));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    time_emb_proj = register_module("time_emb_proj", torch::nn::Linear(temb, out));
    norm2 = register_module("norm2", torch::nn::GroupNorm(torch::nn::GroupNormOptions(4, out)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1)));
    if (in != out) conv_shortcut = register_module("conv_shortcut", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& temb) {
    torch::Tensor h = conv1(torch::silu(norm1(x))) + time_emb_proj(torch::silu(temb)).unsqueeze(-1).unsqueeze(-1);
    h = conv2(torch::silu(norm2(h)));
    return (conv_shortcut ? conv_shortcut(x) : x) + h;
  }
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_shortcut{nullptr};
  torch::nn::Linear time_emb_proj{nullptr};
};
TORCH_MODULE(ToyResBlock);

// Cross-attention over the pixels (diffusers' Transformer2D in miniature): queries from the normalised
// x [B, C, H, W], keys and values from context [B, M, Cc], added back to x.
struct ToyCrossAttentionImpl : torch::nn::Module {
  ToyCrossAttentionImpl(int64_t channels, int64_t context, int64_t heads) {
    norm = register_module("norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(4, channels)));
    nn::CrossAttentionSpec spec;
    spec.query_dim = channels;
    spec.cross_attention_dim = context;
    spec.heads = heads;
    spec.dim_head = channels / heads;
    attn = register_module("attn", nn::CrossAttention(spec));
    torch::NoGradGuard no_grad;
    for (auto& p : attn->parameters()) p.normal_(0.0, 0.3);  // the layer starts at zero, for its model to set
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    const torch::Tensor pixels = norm(x).flatten(2).transpose(1, 2);  // [B, HW, C]
    return x + attn(pixels, context).transpose(1, 2).reshape({b, c, h, w});
  }
  torch::nn::GroupNorm norm{nullptr};
  nn::CrossAttention attn{nullptr};
};
TORCH_MODULE(ToyCrossAttention);

// One row set of the UNet's data: x [B, 2, 4, 4], t [B], context [B, 3, 6], target [B, 2, 4, 4].
struct UNetBatch {
  torch::Tensor x, t, context, target;
  UNetBatch rows(int64_t first, int64_t n) const {
    return {x.narrow(0, first, n), t.narrow(0, first, n), context.narrow(0, first, n), target.narrow(0, first, n)};
  }
  UNetBatch to(torch::Dtype dtype) const { return {x.to(dtype), t.to(dtype), context.to(dtype), target.to(dtype)}; }
};

inline UNetBatch unet_data(int64_t rows) {
  auto generator = at::detail::createCPUGenerator(5);
  const auto f64 = torch::kFloat64;
  UNetBatch data{torch::randn({rows, 2, 4, 4}, generator, f64), torch::rand({rows}, generator, f64) * 1000,
                 torch::randn({rows, 3, 6}, generator, f64), torch::Tensor()};
  data.target = torch::tanh(data.x.flip(-1)) + 0.1 * data.context.mean({1, 2}).view({rows, 1, 1, 1});
  return data;
}

struct UNetToyImpl : torch::nn::Module, hooks::SiteModel {
  UNetToyImpl() {
    // Channels 32 / 64 (a fifth of the parameters in the timestep embedding): the blocks hold ~1 MiB of
    // bf16 weights, so a Gemini budget can hold any one block but not all of them.
    auto time = register_module("time_embedding", std::make_shared<torch::nn::Module>());
    time_1 = time->register_module("linear_1", torch::nn::Linear(8, 256));
    time_2 = time->register_module("linear_2", torch::nn::Linear(256, 256));
    context_proj = register_module("context_proj", torch::nn::Linear(6, 6));
    conv_in = register_module("conv_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 32, 3).padding(1)));
    auto down = register_module("down_blocks", std::make_shared<torch::nn::Module>());
    auto down_0 = down->register_module("0", std::make_shared<torch::nn::Module>());
    down_res.push_back(down_0->register_module("resnet", ToyResBlock(32, 32, 256)));
    down_0_attention = down_0->register_module("attention", ToyCrossAttention(32, 6, 2));
    down_0_sample = down_0->register_module("downsample", nn::Downsample2D(nn::ResampleSpec{32}));
    auto down_1 = down->register_module("1", std::make_shared<torch::nn::Module>());
    down_res.push_back(down_1->register_module("resnet", ToyResBlock(32, 64, 256)));
    auto mid = register_module("mid_block", std::make_shared<torch::nn::Module>());
    mid_res = mid->register_module("resnet", ToyResBlock(64, 64, 256));
    mid_attention = mid->register_module("attention", ToyCrossAttention(64, 6, 2));
    auto up = register_module("up_blocks", std::make_shared<torch::nn::Module>());
    auto up_0 = up->register_module("0", std::make_shared<torch::nn::Module>());
    up_res.push_back(up_0->register_module("resnet", ToyResBlock(128, 64, 256)));
    up_0_sample = up_0->register_module("upsample", nn::Upsample2D(nn::ResampleSpec{64}));
    auto up_1 = up->register_module("1", std::make_shared<torch::nn::Module>());
    up_res.push_back(up_1->register_module("resnet", ToyResBlock(96, 32, 256)));
    up_1_attention = up_1->register_module("attention", ToyCrossAttention(32, 6, 2));
    auto out = register_module("out", std::make_shared<torch::nn::Module>());
    out_norm = out->register_module("norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(4, 32)));
    out_conv = out->register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 2, 3).padding(1)));
    to(torch::kFloat64);
    sites = hooks::BlockSites(*this, {"time_embedding", "context_proj", "conv_in", "down_blocks.0", "down_blocks.1",
                                      "mid_block", "up_blocks.0", "up_blocks.1", "out"});
  }
  torch::nn::Module& module() override { return *this; }
  hooks::BlockSites& block_sites() override { return sites; }

  // The mean squared error of the prediction for `batch`.
  torch::Tensor loss(const UNetBatch& batch) {
    using hooks::Tensors;
    const torch::Tensor frequencies = torch::exp(-std::log(1e4) * torch::arange(4, batch.t.options()) / 4);
    const torch::Tensor angles = batch.t.unsqueeze(1) * frequencies;  // [B, 4]
    const torch::Tensor temb = sites.call("time_embedding", torch::cat({angles.sin(), angles.cos()}, 1),
                                          [this](const torch::Tensor& e) { return time_2(torch::silu(time_1(e))); });  // [B, 256]
    const torch::Tensor context = sites.call("context_proj", batch.context,
                                             [this](const torch::Tensor& c) { return context_proj(c); });  // [B, 3, 6]
    torch::Tensor x = sites.call("conv_in", batch.x, [this](const torch::Tensor& in) { return conv_in(in); });
    // Each down block returns the stream for the next and its skip for the matching up block.
    Tensors out = sites.call("down_blocks.0", {x, temb, context}, [this](const Tensors& in) {
      const torch::Tensor skip = down_0_attention(down_res[0](in[0], in[1]), in[2]);  // [B, 32, 4, 4]
      return Tensors{down_0_sample(skip), skip};                                         // [B, 32, 2, 2], skip
    });
    const torch::Tensor skip_0 = out[1];
    out = sites.call("down_blocks.1", {out[0], temb}, [this](const Tensors& in) {
      const torch::Tensor h = down_res[1](in[0], in[1]);  // [B, 64, 2, 2]
      return Tensors{h, h};
    });
    const torch::Tensor skip_1 = out[1];
    x = sites.call("mid_block", {out[0], temb, context}, [this](const Tensors& in) {
      return Tensors{mid_attention(mid_res(in[0], in[1]), in[2])};
    })[0];
    x = sites.call("up_blocks.0", {x, skip_1, temb}, [this](const Tensors& in) {
      const torch::Tensor h = up_res[0](torch::cat({in[0], in[1]}, 1), in[2]);  // [B, 64, 2, 2]
      return Tensors{up_0_sample(h)};                                              // [B, 64, 4, 4]
    })[0];
    x = sites.call("up_blocks.1", {x, skip_0, temb, context}, [this](const Tensors& in) {
      return Tensors{up_1_attention(up_res[1](torch::cat({in[0], in[1]}, 1), in[2]), in[3])};  // [B, 32, 4, 4]
    })[0];
    return sites.call("out", {x, batch.target}, [this](const Tensors& in) {
      return Tensors{torch::mse_loss(out_conv(torch::silu(out_norm(in[0]))), in[1])};
    })[0];
  }

  torch::nn::Linear time_1{nullptr}, time_2{nullptr}, context_proj{nullptr};
  torch::nn::Conv2d conv_in{nullptr}, out_conv{nullptr};
  nn::Downsample2D down_0_sample{nullptr};
  nn::Upsample2D up_0_sample{nullptr};
  std::vector<ToyResBlock> down_res, up_res;
  ToyResBlock mid_res{nullptr};
  ToyCrossAttention down_0_attention{nullptr}, mid_attention{nullptr}, up_1_attention{nullptr};
  torch::nn::GroupNorm out_norm{nullptr};
  hooks::BlockSites sites;
};
TORCH_MODULE(UNetToy);

// The two-stream model's data: msa [B, 2, 4, 3], pair [B, 4, 4, 2] features and targets per residue
// [B, 4, 1] and per pair [B, 4, 4, 1].
struct TwoStreamBatch {
  torch::Tensor msa, pair, residue_target, pair_target;
  TwoStreamBatch rows(int64_t first, int64_t n) const {
    return {msa.narrow(0, first, n), pair.narrow(0, first, n), residue_target.narrow(0, first, n),
            pair_target.narrow(0, first, n)};
  }
  TwoStreamBatch to(torch::Dtype dtype) const {
    return {msa.to(dtype), pair.to(dtype), residue_target.to(dtype), pair_target.to(dtype)};
  }
};

inline TwoStreamBatch two_stream_data(int64_t rows) {
  auto generator = at::detail::createCPUGenerator(7);
  const auto f64 = torch::kFloat64;
  TwoStreamBatch data{torch::randn({rows, 2, 4, 3}, generator, f64), torch::randn({rows, 4, 4, 2}, generator, f64),
                      torch::Tensor(), torch::Tensor()};
  data.residue_target = torch::sin(data.msa.sum({1, 3})).unsqueeze(-1);
  data.pair_target = torch::cos(data.pair.sum(-1, /*keepdim=*/true));
  return data;
}

// One Evoformer-like block: the MSA stream m [B, S, R, kMsa] takes a bias from the pair stream, and the
// pair stream z [B, R, R, 16] takes the outer product mean of the MSA. Under dynamic axial parallelism
// (`dap` set) each rank holds its residues R' of both: m [B, S, R', kMsa], z's rows [B, R', R, 16]; the
// outer product gathers every residue's projection.
// The MSA width: ~0.3 MiB of bf16 weights per block (8 blocks by default), so a Gemini budget can hold
// one block but not all.
constexpr int64_t kMsa = 384;

struct TwoStreamBlockImpl : torch::nn::Module {
  TwoStreamBlockImpl() {
    msa_norm = register_module("msa_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kMsa})));
    msa_gate = register_module("msa_gate", torch::nn::Linear(kMsa, kMsa));
    pair_bias = register_module("pair_bias", torch::nn::Linear(16, kMsa));
    outer_norm = register_module("outer_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kMsa})));
    outer_in = register_module("outer_in", torch::nn::Linear(kMsa, 16));
    outer_out = register_module("outer_out", torch::nn::Linear(16, 16));
  }
  hooks::Tensors forward(const torch::Tensor& m, const torch::Tensor& z, const dist::GroupPtr& dap) {
    const torch::Tensor bias = pair_bias(z.mean(2)).unsqueeze(1);  // [B, 1, R', kMsa]
    const torch::Tensor m2 = m + bias * torch::sigmoid(msa_gate(msa_norm(m)));
    const torch::Tensor a = outer_in(outer_norm(m2));                            // [B, S, R', 16]
    const torch::Tensor every = dap ? parallel::dap::gather(a, dap, 2) : a;      // [B, S, R, 16]
    const torch::Tensor outer = torch::einsum("bsic,bsjc->bijc", {a, every}) / static_cast<double>(a.size(1));
    return {m2, z + outer_out(outer)};  // outer [B, R', R, 16]
  }
  torch::nn::LayerNorm msa_norm{nullptr}, outer_norm{nullptr};
  torch::nn::Linear msa_gate{nullptr}, pair_bias{nullptr}, outer_in{nullptr}, outer_out{nullptr};
};
TORCH_MODULE(TwoStreamBlock);

// `dap`: the run's dynamic axial parallelism group (runtime.dap; null: off). Under it each rank's loss
// is the mean over its residues, so that averaging over the data and dap ranks gives the whole mean.
struct TwoStreamToyImpl : torch::nn::Module, hooks::SiteModel {
  explicit TwoStreamToyImpl(dist::GroupPtr dap = nullptr, int64_t depth = 8) : dap(std::move(dap)) {
    auto embed = register_module("embed", std::make_shared<torch::nn::Module>());
    msa_in = embed->register_module("msa", torch::nn::Linear(3, kMsa));
    pair_in = embed->register_module("pair", torch::nn::Linear(2, 16));
    auto list = register_module("blocks", std::make_shared<torch::nn::Module>());
    std::vector<std::string> names = {"embed"};
    for (int64_t i = 0; i < depth; ++i) {
      blocks.push_back(list->register_module(std::to_string(i), TwoStreamBlock()));
      names.push_back("blocks." + std::to_string(i));
    }
    auto head = register_module("head", std::make_shared<torch::nn::Module>());
    residue_out = head->register_module("residue", torch::nn::Linear(kMsa, 1));
    pair_out = head->register_module("pair", torch::nn::Linear(16, 1));
    names.push_back("head");
    to(torch::kFloat64);
    sites = hooks::BlockSites(*this, names);
  }
  torch::nn::Module& module() override { return *this; }
  hooks::BlockSites& block_sites() override { return sites; }

  torch::Tensor loss(const TwoStreamBatch& batch) {
    using hooks::Tensors;
    // This rank's residues: the MSA's columns (dim 2) and the pair's rows (dim 1).
    auto mine = [this](const torch::Tensor& x, int64_t dim) { return dap ? parallel::dap::split(x, dap, dim) : x; };
    Tensors streams = sites.call("embed", {mine(batch.msa, 2), mine(batch.pair, 1)}, [this](const Tensors& in) {
      return Tensors{msa_in(in[0]), pair_in(in[1])};
    });
    for (size_t i = 0; i < blocks.size(); ++i) {
      streams = sites.call("blocks." + std::to_string(i), streams,
                           [this, i](const Tensors& in) { return blocks[i]->forward(in[0], in[1], dap); });
    }
    const Tensors head_inputs = {streams[0], streams[1], mine(batch.residue_target, 1), mine(batch.pair_target, 1)};
    return sites.call("head", head_inputs, [this](const Tensors& in) {
      return Tensors{torch::mse_loss(residue_out(in[0].mean(1)), in[2]) + torch::mse_loss(pair_out(in[1]), in[3])};
    })[0];
  }

  torch::nn::Linear msa_in{nullptr}, pair_in{nullptr}, residue_out{nullptr}, pair_out{nullptr};
  std::vector<TwoStreamBlock> blocks;
  hooks::BlockSites sites;
  dist::GroupPtr dap;
};
TORCH_MODULE(TwoStreamToy);

}  // namespace kuafu::testing
